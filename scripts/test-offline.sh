#!/usr/bin/env bash
# The test command on a host without a package registry (a GPU node behind a firewall): the
# tests run against the host's own Python and torch, with everything else installed from a
# wheelhouse built elsewhere by scripts/wheelhouse.sh (which holds the workspace's wheels too).
#
#   bash scripts/test-offline.sh WHEELHOUSE [pytest args...]
#
# Why not `uv sync`: the lock is for the development Python (3.11) and a CPU or PyPI torch; a GPU
# host brings its own interpreter and CUDA build of torch. Every wheel of the wheelhouse is
# installed as is (`--no-deps`: the wheelhouse is already the locked closure, minus what its
# SKIP list left to the host) into .offline-site/, put first on PYTHONPATH. Lint and type checks
# do not depend on the machine; CI runs them (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELHOUSE=${1:?usage: scripts/test-offline.sh WHEELHOUSE [pytest args...]}
shift
WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
PY=${PYTHON:-python3}
SITE=$PWD/.offline-site

ls "$WHEELHOUSE"/genrm_serve-*.whl >/dev/null 2>&1 || {
    echo "test-offline: $WHEELHOUSE holds no genrm_serve wheel: build it with scripts/wheelhouse.sh" >&2
    exit 2
}
rm -rf "$SITE"
echo "[test-offline] installing $(ls "$WHEELHOUSE"/*.whl | wc -l) wheels into $SITE" >&2
"$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile \
    --no-cache-dir --target "$SITE" "$WHEELHOUSE"/*.whl

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PATH="$SITE/bin:$PATH"
# The wheel-isolation test installs genrm-client from here instead of PyPI.
export GENRM_WHEELHOUSE="$WHEELHOUSE"
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
"$PY" - <<'EOF'
import torch
cuda = torch.cuda.is_available()
print(f"[test-offline] torch {torch.__version__}, CUDA: {torch.cuda.get_device_name(0) if cuda else 'none'}")
EOF
exec "$PY" -m pytest "$@"
