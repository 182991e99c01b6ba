#!/usr/bin/env bash
# The test command (README line 2, and what CI runs): set-up, lint, format check, type check, tests.
# pytest's "no tests collected" (exit 5) is a failure like any other.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export UV_FROZEN=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
UV=(python3 -m uv run --frozen --no-sync)
"${UV[@]}" ruff check .
"${UV[@]}" ruff format --check .
"${UV[@]}" mypy packages/genrm-client/src
"${UV[@]}" mypy packages/genrm-serve/src packages/rewards/src packages/rl-core/src
"${UV[@]}" pytest "$@"
