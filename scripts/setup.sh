#!/usr/bin/env bash
# Sets up the workspace on a fresh machine that has only Python and access to the package
# registries: installs uv if missing, provides the CPU build of torch (no 3 GB CUDA download on a
# CPU machine), and syncs the locked environment into .venv. Idempotent; ~10 s when warm.
#
#   GENRM_TORCH=cpu|gpu   force the torch build (default: gpu when nvidia-smi sees a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! "$PY" -m uv --version >/dev/null 2>&1; then
  echo "[setup] installing uv" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check uv
fi
UV=("$PY" -m uv)

flavour=${GENRM_TORCH:-}
if [ -z "$flavour" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then flavour=gpu; else flavour=cpu; fi
fi

# The flat index named `torch-cpu` in pyproject.toml must exist (uv reads it on every sync).
mkdir -p .torch-wheels
if [ "$flavour" = cpu ] && ! ls .torch-wheels/torch-2.13.0+cpu-cp311-*.whl >/dev/null 2>&1; then
  local_whl=$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
  if [ -n "$local_whl" ]; then
    ln -sf "$local_whl" .torch-wheels/
  else
    echo "[setup] downloading the CPU build of torch 2.13.0 from PyTorch's CPU index" >&2
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_28_x86_64 --index-url https://download.pytorch.org/whl/cpu \
      -d .torch-wheels "torch==2.13.0+cpu"
  fi
fi

# Bytecode compiled at install (~50 s on 2 cores, once; ~1 s when up to date): with
# PYTHONDONTWRITEBYTECODE set (as on our development machines) Python never caches it itself,
# and every process (each Ray worker, engine and trainer rank) compiled torch and transformers
# from source: importing a transformers model took 24 s there instead of 12 s.
echo "[setup] uv sync (torch: $flavour)" >&2
if [ "$flavour" = gpu ]; then
  "${UV[@]}" sync --frozen --compile-bytecode --no-group cpu --group gpu "$@"
else
  "${UV[@]}" sync --frozen --compile-bytecode "$@"
fi
# The workspace's own packages are installed editable, so their modules are imported from
# packages/*/src, which the sync does not compile: compiled here too (under a second; about
# 0.1 s of CPU saved in each process that imports rl-core and genrm-serve, a few hundred per
# test run). A stale file is recompiled by Python, as always.
"${UV[@]}" run --frozen --no-sync python -m compileall -q packages/*/src >/dev/null
