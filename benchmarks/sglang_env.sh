# Source on a GPU host without a package registry to run GenRM beside SGLang 0.5.17 unpacked
# from one archive (the one H200 this project measures on; see packages/genrm-serve/README.md,
# "SGLang"):
#
#   SGL_ARCHIVE=path/to/sgl_site.tar.xz WHEELS=path/to/wheels source benchmarks/sglang_env.sh
#
# SGL_ARCHIVE: SGLang and its pure-Python dependencies, with transformers 5.12.1 in tf512/
# (0.5.17 does not import under newer ones); unpacked once into $SGL_DIR (default /tmp/sgl).
# WHEELS (optional): GenRM's own wheels (`uv build --all-packages --wheel`) and what the host lacks
# (pydantic-settings, python-dotenv; pytest-asyncio for the tests), installed into $SITE: the
# packages must be installed, not on PYTHONPATH from source (they read their own versions).
SGL_DIR=${SGL_DIR:-/tmp/sgl}
SITE=${SITE:-/tmp/genrm-site}
if [ ! -f "$SGL_DIR/.staged" ]; then
    mkdir -p "$SGL_DIR" && tar -xJf "$SGL_ARCHIVE" -C "$SGL_DIR" && touch "$SGL_DIR/.staged"
fi
# FI_HEADERS (optional): flashinfer_headers.sh's tar.xz, for attention_backend "flashinfer"
if [ -n "${FI_HEADERS:-}" ]; then
    tar -xJf "$FI_HEADERS" -C "$SGL_DIR"
fi
# WHEELS unset: SGLang alone (benchmarks/export_sglang.py check needs no GenRM package)
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl
fi
export PYTHONPATH="$SITE:$SGL_DIR:$SGL_DIR/tf512${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} LIBRARY_PATH=/usr/local/cuda/lib64/stubs
export LD_LIBRARY_PATH="/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TVM_FFI_CACHE_DIR="$SGL_DIR/jit_cache/tvm-ffi" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
