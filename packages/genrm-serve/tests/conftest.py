"""Shared fixtures of genrm-serve's tests: one local Ray + Serve per module, on a free port."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from genrm_serve.testing import free_port, local_ray_serve, ray_test_env

# Before any test module imports ray.
ray_test_env()


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (for a service a test starts itself)."""
    return free_port()


@pytest.fixture(scope="module")
def serve_port() -> Iterator[int]:
    """A fresh local Ray cluster with Serve's HTTP proxy on a free loopback port."""
    with local_ray_serve(num_cpus=4) as port:
        yield port
