# Build the headers flashinfer's JIT compiler needs and the GPU machine's SGLang archive trims
# (CUTLASS and CCCL, from the flashinfer-python wheel SGLang 0.5.17 pins), as one tar.xz of
# about 2.5 MB to unpack over that archive (sglang_env.sh, FI_HEADERS). With them SGLang's
# "flashinfer" attention backend builds its Hopper kernels on the machine (a few minutes the
# first time); without them its sm90 prefill fails to compile (cutlass/arch/reg_reconfig.h).
#
#   bash benchmarks/flashinfer_headers.sh OUT.tar.xz      # on a machine with PyPI
set -euo pipefail
out=$(realpath -m "${1:-flashinfer_headers.tar.xz}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    -d "$tmp" flashinfer-python==0.6.15.post1
python3 - "$tmp" <<'PY'
import glob, sys, zipfile
tmp = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{tmp}/flashinfer_python-*.whl")[0])
keep = [n for n in wheel.namelist()
        if n.startswith("flashinfer/data/cccl/")
        or (n.startswith("flashinfer/data/cutlass/") and "/include/" in n)]
for name in keep:
    wheel.extract(name, f"{tmp}/x")
print(f"{len(keep)} header files")
PY
tar -cJf "$out" -C "$tmp/x" flashinfer
ls -la "$out"
