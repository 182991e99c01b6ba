"""One local Ray + Serve proxy per test module, on a free loopback port (never 8000)."""

from __future__ import annotations

import os
from collections.abc import Iterator

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Under `uv run`, Ray would ship the working directory to every worker and start it with
# `uv run` there (tens of seconds per worker, or a hang): the installed environment is enough.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import pytest
from rewards_doubles import free_port


@pytest.fixture(scope="module")
def serve_port() -> Iterator[int]:
    """A fresh local Ray cluster with Serve's HTTP proxy on a free port; shut down after."""
    import ray
    from ray import serve

    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
