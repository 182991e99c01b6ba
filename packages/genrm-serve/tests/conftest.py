"""Shared fixtures of genrm-serve's tests: Serve per module, on a free port, on the test
process's shared Ray."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from genrm_serve.testing import free_port, ray_test_env, serve_proxy

# Before any test module imports ray.
ray_test_env()

# --import-mode=importlib does not put test folders on sys.path; the helpers module needs it.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (for a service a test starts itself)."""
    return free_port()


@pytest.fixture(scope="module")
def serve_port(shared_ray: None) -> Iterator[int]:
    """Serve's HTTP proxy on a free loopback port, on the shared Ray; shut down after the file
    (with every app the file deployed)."""
    with serve_proxy() as port:
        yield port
