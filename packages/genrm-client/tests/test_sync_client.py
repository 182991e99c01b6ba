"""SyncGenRMClient: the blocking twin behaves like the async client (same server, same errors)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from genrm_client import (
    GenerateResponse,
    GenRMConnectionError,
    GenRMTimeoutError,
    SyncGenRMClient,
    UnknownRouteKeyError,
)

if TYPE_CHECKING:
    from conftest import StandIn

MSG = [{"role": "user", "content": "hello"}]


def test_sync_generate_health_metrics(server: StandIn) -> None:
    with SyncGenRMClient(server.url, api_key="k") as client:
        assert client.generate(MSG) == "echo:hello"
        full = client.generate_full(MSG, {"temperature": 0.0}, "quality")
        assert client.health().status == "healthy"
        assert "genrm_requests_total" in client.metrics()
    assert client.is_closed
    assert full.meta is not None and full.meta.route_key == "quality"
    assert server.bodies[1]["sampling_params"] == {"temperature": 0.0}
    assert {h["authorization"] for h in server.headers} == {"Bearer k"}


def test_sync_retries_then_succeeds_and_never_retries_404(server: StandIn) -> None:
    server.queue("/generate", 503, {})
    server.queue("/generate", 502, "bad gateway")
    with SyncGenRMClient(server.url) as client:
        assert client.generate(MSG) == "echo:hello"
        assert server.hits["/generate"] == 3
        with pytest.raises(UnknownRouteKeyError, match="nope"):
            client.generate(MSG, route_key="nope")
    assert server.hits["/generate"] == 4


def test_sync_deadline_and_connection_refused(server: StandIn, refused_url: str) -> None:
    server.queue("/generate", delay_s=2)
    with SyncGenRMClient(server.url, timeout=0.3) as client:
        start = time.monotonic()
        with pytest.raises(GenRMTimeoutError):
            client.generate(MSG)
        assert time.monotonic() - start < 1.5
    with (
        SyncGenRMClient(refused_url, max_retries=1) as client,
        pytest.raises(GenRMConnectionError, match="2 attempt"),
    ):
        client.generate(MSG)


def test_sync_generate_many_and_batch(server: StandIn) -> None:
    requests = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(30)]
    requests[7]["route_key"] = "missing"
    with SyncGenRMClient(server.url) as client:
        results = client.generate_many(requests, concurrency=4, return_exceptions=True)
        batch = client.generate_batch(requests[:8])
        with pytest.raises(UnknownRouteKeyError):
            client.generate_many(requests, concurrency=4)
    assert server.max_inflight <= 4
    assert isinstance(results[7], UnknownRouteKeyError) and isinstance(
        batch[7], UnknownRouteKeyError
    )
    texts = [r.response for r in results if isinstance(r, GenerateResponse)]
    assert texts == [f"echo:{i}" for i in range(30) if i != 7]
