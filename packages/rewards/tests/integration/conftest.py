"""One local Ray + Serve proxy per test module, on a free loopback port (never 8000)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from genrm_serve.testing import local_ray_serve, ray_test_env

# Before any test module imports ray.
ray_test_env()


@pytest.fixture(scope="module")
def serve_port() -> Iterator[int]:
    """A fresh local Ray cluster with Serve's HTTP proxy on a free port; shut down after."""
    with local_ray_serve(num_cpus=2) as port:
        yield port
