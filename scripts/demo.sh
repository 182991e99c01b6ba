#!/usr/bin/env bash
# README line 1: set up, then run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Ray 2.60 re-launches workers through `uv run` when the driver runs under it (slow, and it may
# re-sync): our environment is already synced, so workers use it as is.
export UV_FROZEN=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
# The main job: judge service + Gemma 3 270M policy, 3 GRPO steps on generated arithmetic, an
# evaluation, plots and a summary (runs/cpu-demo/). Extra flags override the preset.
exec python3 -m uv run --frozen --no-sync rl-core train --preset cpu-demo --overwrite-run-dir "$@"
