"""One Serve proxy per test module, on a free loopback port (never 8000), on the test process's
shared Ray."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from genrm_serve.testing import ray_test_env, serve_proxy

# Before any test module imports ray.
ray_test_env()


@pytest.fixture(scope="module")
def serve_port(shared_ray: None) -> Iterator[int]:
    """Serve's HTTP proxy on a free port, on the shared Ray; Serve shut down after the file."""
    with serve_proxy() as port:
        yield port
