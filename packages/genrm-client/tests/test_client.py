"""AsyncGenRMClient over real HTTP against the stand-in service: what a reward author relies on."""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from genrm_client import (
    AsyncGenRMClient,
    GenerateResponse,
    GenRMClient,
    GenRMConnectionError,
    GenRMError,
    GenRMHTTPError,
    GenRMOverloadedError,
    GenRMTimeoutError,
    SamplingParams,
    UnknownRouteKeyError,
)

if TYPE_CHECKING:
    from conftest import StandIn

MSG = [{"role": "user", "content": "is 2+2=4? reply 1 or 0"}]


async def test_generate_returns_the_text(server: StandIn) -> None:
    async with AsyncGenRMClient(server.url) as client:
        assert await client.generate(MSG) == "echo:is 2+2=4? reply 1 or 0"
        full = await client.generate_full([{"role": "user", "content": "x"}])
    assert full.response == "echo:x"
    assert full.meta is not None and full.meta.finish_reason == "stop"
    assert GenRMClient is AsyncGenRMClient


async def test_route_key_and_sampling_params_reach_the_server(server: StandIn) -> None:
    async with AsyncGenRMClient(server.url) as client:
        full = await client.generate_full(MSG, {"temperature": 0.2, "top_k": 5}, "safety")
        await client.generate(MSG, SamplingParams(seed=7))
    assert full.meta is not None and full.meta.route_key == "safety"
    assert server.bodies[0] == {
        "messages": MSG,
        "sampling_params": {"temperature": 0.2, "top_k": 5},
        "route_key": "safety",
    }
    # Nothing set is nothing sent: the instance's own config applies.
    assert server.bodies[1] == {"messages": MSG, "sampling_params": {"seed": 7}}


async def test_prefix_key_reaches_the_server_only_when_set(server: StandIn) -> None:
    async with AsyncGenRMClient(server.url) as client:
        await client.generate(MSG, prefix_key="group-7")
        await client.generate_batch([{"messages": MSG, "prefix_key": "group-8"}, {"messages": MSG}])
    assert server.bodies[0] == {"messages": MSG, "prefix_key": "group-7"}
    assert server.bodies[1] == {
        "requests": [{"messages": MSG, "prefix_key": "group-8"}, {"messages": MSG}]
    }


async def test_unknown_route_key_raises_at_once_naming_it(server: StandIn) -> None:
    async with AsyncGenRMClient(server.url, max_retries=5) as client:
        with pytest.raises(UnknownRouteKeyError) as info:
            await client.generate(MSG, route_key="sefaty")
    err = info.value
    assert server.hits["/generate"] == 1  # never retried
    assert err.route_key == "sefaty" and err.status == 404
    assert err.registered == ["__default__", "quality", "safety"]
    assert "route_key=sefaty" in str(err) and "safety" in str(err)


async def test_a_bare_404_is_no_service_at_that_path_never_an_unknown_route_key(
    server: StandIn,
) -> None:
    server.queue("/generate", 404, "Not Found")  # not GenRM's error body: another path's 404
    async with AsyncGenRMClient(server.url) as client:
        with pytest.raises(GenRMHTTPError, match="no GenRM service at that path") as info:
            await client.generate(MSG)
    assert not isinstance(info.value, UnknownRouteKeyError) and info.value.status == 404
    assert "route_key" not in str(info.value) and "GENRM_URL" in str(info.value)
    assert server.hits["/generate"] == 1


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        (
            "http://127.0.0.1:8000/generate",
            "set GENRM_URL (or base_url) to http://127.0.0.1:8000/genrm",
        ),
        ("http://judge:9000/api/generate", "it is the service's address with its route prefix"),
    ],
    ids=["no-prefix", "another-prefix"],
)
def test_the_404_hint_names_the_route_prefix(url: str, hint: str) -> None:
    from genrm_client._client import _route_prefix_hint

    assert hint in _route_prefix_hint(url)


#: what Ray Serve's HTTP proxy answers for a path no application serves
RAY_SERVE_404 = "Path '/generate' not found. Ping http://127.0.0.1:8000/-/routes for routes."


@pytest.mark.parametrize(
    ("answer", "path"),
    [
        (httpx.Response(404, text=RAY_SERVE_404), "/generate"),
        (
            httpx.Response(404, json={"error": {"type": "not_found", "message": "Not Found"}}),
            "/v1/generate",
        ),
    ],
    ids=["ray-serve-proxy", "genrm-ingress-wrong-path"],
)
async def test_a_base_url_without_the_route_prefix_is_named_as_such(
    answer: httpx.Response, path: str
) -> None:
    """GENRM_URL=http://host:8000 (no /genrm) was reported as "No GenRM instance registered for
    route_key=__default__", sending the user to the judge's configuration."""
    from genrm_client import GenRMHTTPError, UnknownRouteKeyError

    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return answer

    base = "http://127.0.0.1:8000" + path.removesuffix("/generate")
    client = AsyncGenRMClient(base, max_retries=0, transport=httpx.MockTransport(handler))
    async with client:
        with pytest.raises(GenRMHTTPError) as info:
            await client.generate(MSG)
    assert seen == [path]
    assert not isinstance(info.value, UnknownRouteKeyError)
    assert "No GenRM instance registered" not in str(info.value)
    assert "route prefix" in str(info.value) and "/genrm" in str(info.value)


async def test_503_twice_then_success(server: StandIn, fast_backoff: list[int]) -> None:
    busy = {"error": {"type": "overloaded", "message": "queue full"}}
    server.queue("/generate", 503, busy, times=2)
    async with AsyncGenRMClient(server.url, max_retries=2) as client:
        assert await client.generate(MSG) == "echo:is 2+2=4? reply 1 or 0"
    assert server.hits["/generate"] == 3
    assert fast_backoff == [0, 1]  # backoff grows with the attempt number
    # One request id for every attempt of the call, so the server can join them.
    ids = {h["x-request-id"] for h in server.headers}
    assert len(ids) == 1


async def test_overloaded_after_every_retry(server: StandIn) -> None:
    busy = {"error": {"type": "overloaded", "message": "queue full"}}
    server.queue("/generate", 503, busy, times=3)
    async with AsyncGenRMClient(server.url, max_retries=2) as client:
        with pytest.raises(GenRMOverloadedError) as info:
            await client.generate(MSG)
    assert server.hits["/generate"] == 3
    assert info.value.status == 503 and info.value.body == busy
    assert "queue full" in str(info.value) and "3 attempt(s)" in str(info.value)


async def test_a_503_marked_not_to_be_retried_is_raised_at_once(server: StandIn) -> None:
    failed = {"error": {"type": "engine_unavailable", "message": "the retry failed too"}}
    server.queue("/generate", 503, failed, {"x-should-retry": "false"}, times=4)
    async with AsyncGenRMClient(server.url, max_retries=3) as client:
        with pytest.raises(GenRMOverloadedError) as info:
            await client.generate(MSG)
    assert server.hits["/generate"] == 1  # the service already retried it on another engine
    assert "1 attempt(s)" in str(info.value) and "the retry failed too" in str(info.value)


async def test_429_retry_after_is_honoured(server: StandIn, fast_backoff: list[int]) -> None:
    server.queue("/generate", 429, {}, {"Retry-After": "1"})
    async with AsyncGenRMClient(server.url) as client:
        assert await client.generate(MSG) == "echo:is 2+2=4? reply 1 or 0"
    first, second = server.hit_times["/generate"]
    assert second - first >= 0.95  # the server's wait, not the 10 ms test backoff
    assert fast_backoff == []


async def test_retry_after_longer_than_the_deadline_gives_up_at_once(server: StandIn) -> None:
    server.queue("/generate", 429, {}, {"Retry-After": "20"})
    async with AsyncGenRMClient(server.url, timeout=2) as client:
        start = time.monotonic()
        with pytest.raises(GenRMOverloadedError):
            await client.generate(MSG)
    assert time.monotonic() - start < 1.5
    assert server.hits["/generate"] == 1


@pytest.mark.parametrize("status", [400, 401, 408, 409, 422], ids=lambda s: f"http{s}")
async def test_other_4xx_are_never_retried(server: StandIn, status: int) -> None:
    body = {"error": {"type": "invalid_request", "message": "bad"}}
    server.queue("/generate", status, body)
    async with AsyncGenRMClient(server.url, max_retries=3) as client:
        with pytest.raises(GenRMHTTPError) as info:
            await client.generate(MSG)
    assert server.hits["/generate"] == 1
    assert info.value.status == status
    assert not isinstance(info.value, GenRMOverloadedError | UnknownRouteKeyError)
    assert info.value.body == body


async def test_500_is_retried_then_reported_with_its_body(server: StandIn) -> None:
    body = {"error": {"type": "engine_error", "message": "CUDA OOM"}}
    server.queue("/generate", 500, body, times=2)
    async with AsyncGenRMClient(server.url, max_retries=1) as client:
        with pytest.raises(GenRMHTTPError) as info:
            await client.generate(MSG)
    assert server.hits["/generate"] == 2
    assert info.value.status == 500 and "CUDA OOM" in str(info.value)
    assert info.value.request_id == server.headers[0]["x-request-id"]


async def test_deadline_bounds_a_slow_server(server: StandIn) -> None:
    server.queue("/generate", delay_s=3)
    async with AsyncGenRMClient(server.url, timeout=0.4) as client:
        start = time.monotonic()
        with pytest.raises(GenRMTimeoutError, match=r"0\.4 s"):
            await client.generate(MSG)
    assert time.monotonic() - start < 1.5


async def test_per_call_timeout_overrides_the_client_default(server: StandIn) -> None:
    server.queue("/generate", delay_s=0.6, times=2)
    async with AsyncGenRMClient(server.url, timeout=10) as client:
        with pytest.raises(GenRMTimeoutError):
            await client.generate(MSG, timeout=0.2)
    async with AsyncGenRMClient(server.url, timeout=0.2) as client:
        assert await client.generate(MSG, timeout=5) == "echo:is 2+2=4? reply 1 or 0"


async def test_deadline_bounds_retries(server: StandIn) -> None:
    server.queue("/generate", 503, {}, delay_s=0.05, times=200)
    async with AsyncGenRMClient(server.url, timeout=0.5, max_retries=1000) as client:
        start = time.monotonic()
        with pytest.raises((GenRMOverloadedError, GenRMTimeoutError)):
            await client.generate(MSG)
    assert time.monotonic() - start < 1.5
    assert 2 <= server.hits["/generate"] < 200


async def test_connection_refused_after_retries(refused_url: str, fast_backoff: list[int]) -> None:
    async with AsyncGenRMClient(refused_url, max_retries=2, timeout=10) as client:
        start = time.monotonic()
        with pytest.raises(GenRMConnectionError, match="3 attempt") as info:
            await client.generate(MSG)
    assert time.monotonic() - start < 5
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert fast_backoff == [0, 1]


async def test_max_connections_bounds_500_concurrent_calls(server: StandIn) -> None:
    server.delay_s = 0.01
    async with AsyncGenRMClient(server.url, max_connections=8) as client:
        texts = await asyncio.gather(
            *(client.generate([{"role": "user", "content": str(i)}]) for i in range(500))
        )
    assert texts == [f"echo:{i}" for i in range(500)]
    assert server.hits["/generate"] == 500
    assert 2 <= server.max_inflight <= 8
    assert len(server.client_ports) <= 8  # connections were reused, never more than the pool


async def test_api_key_is_sent_as_bearer(server: StandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    async with AsyncGenRMClient(server.url, api_key="s3cret") as client:
        await client.generate(MSG)
    monkeypatch.setenv("GENRM_API_KEY", "from-env")
    async with AsyncGenRMClient(server.url) as client:
        await client.health()
    monkeypatch.delenv("GENRM_API_KEY")
    async with AsyncGenRMClient(server.url) as client:
        await client.metrics()
    auth = [h.get("authorization") for h in server.headers]
    assert auth == ["Bearer s3cret", "Bearer from-env", None]


async def test_generate_batch_returns_per_item_errors(server: StandIn) -> None:
    requests = [
        {"messages": [{"role": "user", "content": "a"}]},
        {"messages": [{"role": "user", "content": "b"}], "route_key": "nope"},
        {"messages": [{"role": "user", "content": "c"}], "route_key": "quality"},
    ]
    async with AsyncGenRMClient(server.url) as client:
        results = await client.generate_batch(requests)
    assert server.hits["/generate_batch"] == 1
    first, second, third = results
    assert isinstance(first, GenerateResponse) and first.response == "echo:a"
    assert isinstance(second, UnknownRouteKeyError) and second.route_key == "nope"
    assert second.registered == ["__default__", "quality", "safety"]
    assert isinstance(third, GenerateResponse) and third.meta is not None
    assert third.meta.route_key == "quality"


async def test_generate_batch_maps_each_error_type(server: StandIn) -> None:
    def err(kind: str) -> dict[str, object]:
        return {"error": {"type": kind, "message": f"{kind} happened"}}

    kinds = ["overloaded", "timeout", "engine_error", "new_kind", "prompt_too_long"]
    server.queue("/generate_batch", 200, {"results": [err(k) for k in kinds]})
    async with AsyncGenRMClient(server.url) as client:
        results = await client.generate_batch([{"messages": MSG}] * len(kinds))
    overloaded, timed_out, engine, unknown, too_long = results
    assert isinstance(too_long, GenRMHTTPError) and too_long.status == 413
    assert isinstance(overloaded, GenRMOverloadedError) and overloaded.status == 429
    assert isinstance(timed_out, GenRMTimeoutError)
    assert isinstance(engine, GenRMHTTPError) and engine.status == 500
    assert "engine_error happened" in str(engine)
    assert isinstance(unknown, GenRMHTTPError) and unknown.status == 500


async def test_generate_batch_rejects_a_short_answer(server: StandIn) -> None:
    server.queue("/generate_batch", 200, {"results": [{"response": "1"}]})
    async with AsyncGenRMClient(server.url) as client:
        with pytest.raises(GenRMError, match="2 requests but got 1"):
            await client.generate_batch([{"messages": MSG}] * 2)


async def test_generate_many_keeps_input_order(server: StandIn) -> None:
    # Later requests answer faster, so completion order differs from input order.
    for i in range(5):
        server.queue("/generate", delay_s=0.05 * (5 - i))
    requests = [{"messages": [{"role": "user", "content": str(i)}]} for i in range(20)]
    async with AsyncGenRMClient(server.url) as client:
        results = await client.generate_many(requests, concurrency=5)
    assert [r.response for r in results] == [f"echo:{i}" for i in range(20)]
    assert server.max_inflight <= 5


async def test_generate_many_return_exceptions(server: StandIn) -> None:
    requests = [
        {"messages": MSG},
        {"messages": MSG, "route_key": "missing"},
        {"messages": MSG, "route_key": "safety"},
    ]
    async with AsyncGenRMClient(server.url) as client:
        results = await client.generate_many(requests, return_exceptions=True)
        with pytest.raises(UnknownRouteKeyError, match="missing"):
            await client.generate_many(requests)
    assert isinstance(results[0], GenerateResponse)
    assert isinstance(results[1], UnknownRouteKeyError)
    assert isinstance(results[2], GenerateResponse)


async def test_bad_input_is_rejected_before_any_network(server: StandIn) -> None:
    async with AsyncGenRMClient(server.url) as client:
        with pytest.raises(ValueError, match="max_tokens") as info:
            await client.generate(MSG, {"temperature": 0.2, "max_tokens": 5})
        assert "max_response_len" in str(info.value)  # the allowed keys are listed
        with pytest.raises(ValueError, match="temperature"):
            await client.generate(MSG, {"temperature": -1})
        with pytest.raises(ValueError, match="role"):
            await client.generate([{"role": "judge", "content": "x"}])
        with pytest.raises(TypeError, match="messages"):
            await client.generate("just a string")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"requests\[1\].*max_tokens"):
            await client.generate_many(
                [{"messages": MSG}, {"messages": MSG, "sampling_params": {"max_tokens": 1}}]
            )
        with pytest.raises(ValueError, match=r"requests\[0\].*rout_key"):
            await client.generate_batch([{"messages": MSG, "rout_key": "x"}])
    assert sum(server.hits.values()) == 0


async def test_health_and_metrics(server: StandIn) -> None:
    async with AsyncGenRMClient(server.url) as client:
        report = await client.health()
        assert (report.status, report.service) == ("healthy", "genrm")
        assert "genrm_requests_total" in await client.metrics()
        server.healthy = False
        unhealthy = await client.health()
    assert unhealthy.status == "unhealthy" and unhealthy.instances is not None
    assert unhealthy.instances["quality"].detail == "engine died"
    assert server.hits["/health"] == 2  # an unhealthy report is an answer, not retried


async def test_closed_client_refuses_calls(server: StandIn) -> None:
    client = AsyncGenRMClient(server.url)
    await client.generate(MSG)
    await client.aclose()
    await client.aclose()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await client.generate(MSG)


def test_errors_survive_pickling() -> None:
    errors: list[GenRMError] = [
        UnknownRouteKeyError("q", ["a", "b"], body={"x": 1}, request_id="r1"),
        GenRMOverloadedError("busy", status=429, body="b", request_id="r2"),
        GenRMHTTPError("bad", status=400, body={"error": {}}),
        GenRMTimeoutError("late"),
    ]
    for err in errors:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == str(err)
        assert vars(copy) == vars(err)


def test_constructor_rejects_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="http"):
        AsyncGenRMClient("localhost:8000/genrm")
    with pytest.raises(ValueError, match="timeout"):
        AsyncGenRMClient("http://x", timeout=0)
    monkeypatch.setenv("GENRM_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="GENRM_TIMEOUT_S='soon'"):
        AsyncGenRMClient()
