"""The one "local Ray + Serve on a free loopback port" helper that every package's tests use, and
what a test of a started service waits for.

Several test sessions share one machine, so a fixed port (8000) or a plain ``ray.init()`` (which
may join a stale cluster) would make them collide: each test cluster is ``address="local"`` and
takes a port nothing listens on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

from genrm_serve.ray_env import apply_ray_env_defaults

__all__ = ["free_port", "lines_until", "local_ray_serve", "ray_test_env", "serve_proxy"]


def free_port() -> int:
    """A loopback port nothing listens on right now (``genrm_serve.app.free_port``, imported
    lazily: this module stays light to import)."""
    from genrm_serve.app import free_port as _free_port

    return _free_port()


def lines_until(stream: IO[str], prefix: str, timeout_s: float = 150.0) -> list[str]:
    """The lines a command prints, read up to the first that starts with ``prefix`` (or the
    end of its output, or ``timeout_s``): what a test of ``genrm-serve run`` waits for."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith(prefix):
            break
    return lines


def ray_test_env() -> None:
    """Set (``setdefault``) the env of a private test cluster; call before importing ray."""
    apply_ray_env_defaults(disable_auth=True)


@contextmanager
def local_ray_serve(num_cpus: int, port: int | None = None) -> Iterator[int]:
    """A fresh local Ray cluster with Serve's HTTP proxy on ``port`` (a free one when ``None``).

    Yields the port; shuts Serve and Ray down on exit.
    """
    ray_test_env()
    import ray

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        with serve_proxy(port) as bound:
            yield bound
    finally:
        ray.shutdown()


@contextmanager
def serve_proxy(port: int | None = None) -> Iterator[int]:
    """Serve's HTTP proxy on the Ray this process has up, on ``port`` (a free one when
    ``None``); Serve, with every app deployed on it, shut down on exit, and Ray left up."""
    from ray import serve

    from genrm_serve.app import start_proxy

    try:
        # a free port is chosen after Ray's own processes are up, and replaced if lost
        yield start_proxy("127.0.0.1", port)
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
