"""Shared fixtures of genrm-serve's tests: one local Ray + Serve per module, on a free port."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Under `uv run`, Ray 2.60 otherwise ships the working directory to every worker and starts the
# workers with `uv run` there; they die before registering and serve.start() hangs.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (for a service a test starts itself)."""
    return free_port()


@pytest.fixture(scope="module")
def serve_port() -> Iterator[int]:
    """A fresh local Ray cluster with Serve's HTTP proxy on a free loopback port."""
    import ray
    from ray import serve

    port = free_port()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        serve.shutdown()
        ray.shutdown()
