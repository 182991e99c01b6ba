#!/usr/bin/env bash
# README line 1: set up, then run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export UV_FROZEN=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
exec python3 -m uv run --frozen --no-sync python scripts/client_demo.py "$@"
