#!/usr/bin/env bash
# The test command (README line 2, and what CI runs): set-up, lint, format check, type check, tests.
# pytest's "no tests collected" (exit 5) is a failure like any other.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Ray 2.60 re-launches workers through `uv run` when the driver runs under it (slow, and it may
# re-sync): our environment is already synced, so workers use it as is.
export UV_FROZEN=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
UV=(python3 -m uv run --frozen --no-sync)
"${UV[@]}" ruff check .
"${UV[@]}" ruff format --check .
"${UV[@]}" mypy packages/genrm-client/src
"${UV[@]}" mypy packages/genrm-serve/src packages/rewards/src packages/rl-core/src
# Two processes (pytest-xdist), one test file each at a time: most of a Ray-based test is waiting
# (cluster start, engine start-up, HTTP), so two files overlap on 2 cores. A file stays in one
# process, so its module fixtures (a Ray cluster, a served model) are built once.
# GENRM_TEST_WORKERS=N for another count; `bash scripts/test.sh -n 0` runs in one process.
"${UV[@]}" pytest -n "${GENRM_TEST_WORKERS:-2}" --dist loadfile "$@"
