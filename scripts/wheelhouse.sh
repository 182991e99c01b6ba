#!/usr/bin/env bash
# Build a wheelhouse for a GPU host without a package registry: the workspace's own wheels plus
# every dependency they need there, as binary wheels for Python 3.12 on manylinux x86_64.
#
#   bash scripts/wheelhouse.sh [OUT_DIR]          # default: ./wheelhouse
#
# Environment:
#   PYTHON_VERSION  target interpreter (default 3.12)
#   PACKAGES        what to install there (default: genrm-rl-core, which pulls genrm-serve,
#                   genrm-client and genrm-rewards)
#   DRY_RUN=1       build the workspace wheels and print the dependency list, download nothing
#   SKIP            space-separated distribution names the host already has, left out of the
#                   download (default: torch and its CUDA libraries — GPU images ship their own
#                   torch, and its wheels alone are ~3 GB)
#
# Then, on the host (copy OUT_DIR over first):
#   python3 -m pip install --no-index --find-links wheelhouse genrm-rl-core
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-wheelhouse}
PY=${PYTHON_VERSION:-3.12}
PACKAGES=${PACKAGES:-genrm-rl-core}
SKIP=${SKIP:-torch triton nvidia-*}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

echo "== workspace wheels → $OUT"
python3 -m uv build --all-packages --wheel --out-dir "$OUT"

# The dependency list the host needs, from the lock (the versions CI tested), without the
# workspace members themselves (their wheels are built above) and without SKIP.
# Plus, from the dev group, the test runner and the plugins scripts/test-offline.sh needs
# (pytest-asyncio above all: a GPU image's pytest may come without it, and every async test
# then errors), not the lint and type tools, which CI runs.
REQS=$(mktemp)
trap 'rm -f "$REQS" "$REQS.all" "$REQS.dev"' EXIT
python3 -m uv export --frozen --no-hashes --no-emit-workspace --no-dev --all-packages \
    --format requirements-txt --python "$PY" -o "$REQS.all" >/dev/null
python3 -m uv export --frozen --no-hashes --no-emit-workspace --only-group dev --all-packages \
    --format requirements-txt --python "$PY" -o "$REQS.dev" >/dev/null
# shellcheck disable=SC2086
python3 - "$REQS.all" "$REQS.dev" "$REQS" $SKIP <<'EOF'
import fnmatch, re, sys
src, dev, dst, *skip = sys.argv[1:]
TEST_TOOLS = ("pytest", "pytest-*", "execnet", "iniconfig", "pluggy")


def requirements(path):
    for line in open(path):
        line = line.strip()
        if line and not line.startswith(("#", "-e", ".")):
            name = re.split(r"[=<>!~; \[]", line, maxsplit=1)[0].lower().replace("_", "-")
            yield name, line


keep = {n: r for n, r in requirements(src) if not any(fnmatch.fnmatch(n, p) for p in skip)}
tools = {n: r for n, r in requirements(dev) if any(fnmatch.fnmatch(n, p) for p in TEST_TOOLS)}
keep |= tools
open(dst, "w").write("\n".join(keep.values()) + "\n")
print(f"{len(keep)} dependencies, {len(tools)} test tools (skipped: {' '.join(skip) or 'none'})")
EOF

if [[ -n "${DRY_RUN:-}" ]]; then
    cat "$REQS"
    exit 0
fi

echo "== dependencies for CPython $PY, manylinux x86_64 → $OUT"
PLATFORMS=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64 \
    manylinux1_x86_64 linux_x86_64 any; do
    PLATFORMS+=(--platform "$p")
done
# --no-deps: the exported list is already the full, locked closure.
python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
    --python-version "$PY" "${PLATFORMS[@]}" -d "$OUT" -r "$REQS"

echo "== $(find "$OUT" -name '*.whl' | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
echo "install on the host: python3 -m pip install --no-index --find-links $OUT $PACKAGES"
