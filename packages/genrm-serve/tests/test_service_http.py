"""The judge service end to end: real Ray Serve, real HTTP on loopback, the scripted test engine.

Two apps share one Serve proxy (one Ray per module):

* ``/genrm``: two instances, engines created by the service (standalone mode, a placement group
  per instance): ``quality`` (2 engines, max_context_len 50) and ``safety`` (1 engine). Each
  engine replies with the instance and engine it is, so routing is proven by the engine itself.
* ``/solo/genrm``: one ``__default__`` instance whose engine the test creates itself (the way
  rl-core passes its own actors), with an API key and a tiny queue (429 under load).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray
from service_calls import USER, get, metric, post

from genrm_client.types import DEFAULT_ROUTE_KEY
from genrm_serve.app import EngineStartError, build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import scripted_model_path

API_KEY = "test-secret"


@pytest.fixture(scope="module")
def multi(serve_port: int) -> Iterator[ServeArgs]:
    instances = build_instances(
        instances={
            "quality": {
                "model_path": scripted_model_path(default="q|{route_key}|{engine_id}"),
                "num_gpus": 2,
                "engine_config": {"max_context_len": 50},
            },
            "safety": {
                "model_path": scripted_model_path(default="s|{route_key}|{engine_id}"),
                "num_gpus": 1,
            },
        },
        engine="scripted",
    )
    args = ServeArgs(
        port=serve_port,
        app_name="multi",
        api_key=None,
        engine_num_cpus=0.1,
        health_check_period_s=0.5,
        probe_timeout_s=5.0,
        restart_backoff_s=2.0,
    )
    deploy(build_app(instances, args=args), args)
    wait_until_healthy(args, 120)
    yield args


#: the solo app's request deadline: far above its engine's 0.3 s a request, so that a burst's
#: admitted requests (queued behind at most 2 others) finish on a loaded 2-core machine too (at
#: 2.5 s one admitted request of a burst of 20 was once answered 504 there)
SOLO_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def solo(serve_port: int) -> Iterator[tuple[ServeArgs, Any]]:
    from genrm_serve.engines.worker import create_engine_worker

    instances = build_instances(
        model_path=scripted_model_path(default="1", delay_s=0.3),
        engine="scripted",
        engine_config={"max_batch_size": 1, "max_queued_requests": 2},
    )
    spec = instances[DEFAULT_ROUTE_KEY]
    # Created here, as rl-core does, with Ray's own restart policy instead of a placement.
    handle = create_engine_worker(spec, 0, num_cpus=0.1, max_restarts=-1, name="solo-judge-0")
    args = ServeArgs(
        port=serve_port,
        app_name="solo",
        route_prefix="/solo/genrm",
        api_key=API_KEY,
        engine_inflight_limit=1,
        health_check_period_s=0.5,
        request_timeout_s=SOLO_TIMEOUT_S,
    )
    # Passed by name, as a caller that created its actors elsewhere may do.
    app = build_app(instances, engines={DEFAULT_ROUTE_KEY: ["solo-judge-0"]}, args=args)
    deploy(app, args)
    wait_until_healthy(args, 120)
    yield args, handle


# ---- health ----------------------------------------------------------------------------------


def test_health_two_instances_lists_each(multi: ServeArgs) -> None:
    r = get(multi, "/health")
    assert r.status_code == 200
    assert r.json() == {
        "status": "healthy",
        "service": "genrm",
        "instances": {"quality": {"status": "healthy"}, "safety": {"status": "healthy"}},
    }


def test_health_one_instance_is_exactly_the_spec_body(solo: tuple[ServeArgs, Any]) -> None:
    args, _ = solo
    r = get(args, "/health")  # no API key needed for health
    assert r.status_code == 200
    assert r.json() == {"status": "healthy", "service": "genrm"}


# ---- routing ---------------------------------------------------------------------------------


def test_requests_reach_the_instance_named_by_route_key(multi: ServeArgs) -> None:
    seen: dict[str, set[str]] = {"quality": set(), "safety": set()}
    for _ in range(8):
        for key in ("quality", "safety"):
            r = post(multi, "/generate", {"messages": [USER], "route_key": key})
            assert r.status_code == 200, r.text
            body = r.json()
            prefix, route_key, engine_id = body["response"].split("|")
            assert prefix == key[0] and route_key == key, body
            assert body["meta"]["route_key"] == key
            assert body["meta"]["engine_id"] == engine_id
            seen[key].add(engine_id)
    assert seen == {"quality": {"quality/0", "quality/1"}, "safety": {"safety/0"}}


def test_a_prefix_keys_requests_reach_one_engine_single_and_batched(multi: ServeArgs) -> None:
    before = metric(
        get(multi, "/metrics").text, "genrm_affinity_requests", route_key="quality", routed="home"
    )
    seen: dict[str, set[str]] = {f"group-{g}": set() for g in range(6)}
    for _ in range(3):  # spread: one request of each group at a time
        for key in seen:
            body = {"messages": [USER], "route_key": "quality", "prefix_key": key}
            r = post(multi, "/generate", body)
            assert r.status_code == 200, r.text
            seen[key].add(r.json()["meta"]["engine_id"])
    reqs = [{"messages": [USER], "route_key": "quality", "prefix_key": key} for key in seen] * 2
    r = post(multi, "/generate_batch", {"requests": reqs})
    assert r.status_code == 200, r.text
    for req, res in zip(reqs, r.json()["results"], strict=True):
        seen[req["prefix_key"]].add(res["meta"]["engine_id"])
    assert all(len(engines) == 1 for engines in seen.values()), seen
    assert set.union(*seen.values()) == {"quality/0", "quality/1"}  # keys use both engines
    text = get(multi, "/metrics").text
    home = metric(text, "genrm_affinity_requests", route_key="quality", routed="home")
    assert home - before == 30


def test_standalone_engines_live_in_their_instance_placement_group(multi: ServeArgs) -> None:
    engines = get(multi, "/engines").json()["instances"]
    pgs = {}
    for key, slots in engines.items():
        for s in slots:
            actor = ray.get_actor(s["actor_name"], namespace=s["namespace"])
            info = ray.get(actor.info.remote(), timeout=30)
            assert info["route_key"] == key
            assert info["placement_group_id"] is not None
            pgs.setdefault(key, set()).add(info["placement_group_id"])
    assert len(pgs["quality"]) == 1 and len(pgs["safety"]) == 1
    assert pgs["quality"] != pgs["safety"]


def test_no_route_key_on_a_service_without_default_is_404(multi: ServeArgs) -> None:
    r = post(multi, "/generate", {"messages": [USER]})
    assert r.status_code == 404
    assert r.json()["error"]["registered_route_keys"] == ["quality", "safety"]


def test_unknown_route_key_is_404_naming_it_and_the_registered_keys(multi: ServeArgs) -> None:
    r = post(multi, "/generate", {"messages": [USER], "route_key": "helpfulness"})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["type"] == "unknown_route_key"
    assert "No GenRM instance registered for route_key=helpfulness" in err["message"]
    assert err["route_key"] == "helpfulness"
    assert err["registered_route_keys"] == ["quality", "safety"]


# ---- bad requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "bot", "content": "x"}]},
        {"messages": []},
        {"messages": [USER], "sampling_params": {"temprature": 0.1}},
        {"messages": [USER], "sampling_params": {"top_p": 2.0}},
        {"prompt": "x"},
    ],
    ids=[
        "bad-role",
        "no-messages",
        "unknown-sampling-key",
        "top_p-out-of-range",
        "no-messages-key",
    ],
)
def test_malformed_body_is_422_and_the_service_keeps_serving(
    multi: ServeArgs, body: dict[str, Any]
) -> None:
    r = post(multi, "/generate", body)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["type"] == "invalid_request"
    assert err["message"].startswith("invalid request:")
    ok = post(multi, "/generate", {"messages": [USER], "route_key": "safety"})
    assert ok.status_code == 200


def test_invalid_json_is_422(multi: ServeArgs) -> None:
    r = httpx.post(
        f"{multi.url}/generate",
        content=b'{"messages": [',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 422
    assert r.json()["error"]["type"] == "invalid_request"


def test_prompt_over_max_context_len_is_413(multi: ServeArgs) -> None:
    long = {"role": "user", "content": "word " * 60}  # quality: max_context_len 50 words
    r = post(multi, "/generate", {"messages": [long], "route_key": "quality"})
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["type"] == "prompt_too_long"
    assert "max_context_len=50" in err["message"]


def test_sampling_params_reach_the_engine(multi: ServeArgs) -> None:
    r = post(
        multi,
        "/generate",
        {"messages": [USER], "route_key": "safety", "sampling_params": {"stop": ["|"]}},
    )
    assert r.status_code == 200
    assert r.json()["response"] == "s"


# ---- batch -----------------------------------------------------------------------------------


def test_generate_batch_answers_each_request_in_order(multi: ServeArgs) -> None:
    long = {"role": "user", "content": "word " * 60}
    keys = ["safety", "quality", "nope", "quality", "safety"] * 4
    reqs = [{"messages": [USER], "route_key": k} for k in keys]
    reqs[3] = {"messages": [long], "route_key": "quality"}
    r = post(multi, "/generate_batch", {"requests": reqs})
    assert r.status_code == 200
    results = r.json()["results"]
    assert len(results) == len(reqs)
    for i, (key, res) in enumerate(zip(keys, results, strict=True)):
        if key == "nope":
            assert res["error"]["type"] == "unknown_route_key"
        elif i == 3:
            assert res["error"]["type"] == "prompt_too_long"
        else:
            assert res["response"].split("|")[1] == key


# ---- OpenAI-compatible endpoint ---------------------------------------------------------------


def test_openai_chat_completions_routes_by_model(multi: ServeArgs) -> None:
    r = post(
        multi,
        "/v1/chat/completions",
        {"model": "safety", "messages": [USER], "temperature": 0.0, "max_tokens": 4},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == "safety"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "s|safety|safety/0"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == (
        body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )
    models = get(multi, "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["quality", "safety"]


def test_openai_unknown_model_and_unsupported_options(multi: ServeArgs) -> None:
    r = post(multi, "/v1/chat/completions", {"model": "gpt-4", "messages": [USER]})
    assert r.status_code == 404
    assert "route_key=gpt-4" in r.json()["error"]["message"]
    r = post(multi, "/v1/chat/completions", {"model": "safety", "messages": [USER], "n": 3})
    assert r.status_code == 422
    assert "n" in r.json()["error"]["message"]


# ---- metrics ---------------------------------------------------------------------------------


def test_metrics_counters_move(multi: ServeArgs) -> None:
    before = get(multi, "/metrics").text
    for _ in range(3):
        assert post(multi, "/generate", {"messages": [USER], "route_key": "safety"}).is_success
    post(multi, "/generate", {"messages": [USER], "route_key": "zzz"})
    after = get(multi, "/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    ok = {"route_key": "safety", "outcome": "success"}
    assert (
        metric(text, "genrm_requests_total", **ok)
        == metric(before, "genrm_requests_total", **ok) + 3
    )
    assert metric(text, "genrm_prompt_tokens_total", route_key="safety") > metric(
        before, "genrm_prompt_tokens_total", route_key="safety"
    )
    assert metric(text, "genrm_request_latency_seconds_count", route_key="safety") >= 3
    assert metric(text, "genrm_unknown_route_key_requests_total") >= 1
    assert metric(text, "genrm_engines_total", route_key="quality") == 2
    assert metric(text, "genrm_engines_healthy", route_key="quality") == 2
    assert metric(text, "genrm_instance_asleep", route_key="safety") == 0
    assert metric(text, "genrm_requests_in_flight", route_key="safety") == 0
    assert metric(text, "genrm_requests_queued", route_key="safety") == 0


# ---- sleep / wake ----------------------------------------------------------------------------


def test_sleep_and_wake_one_instance(multi: ServeArgs) -> None:
    r = post(multi, "/sleep", {"route_key": "safety"})
    assert r.status_code == 200 and r.json()["route_keys"] == ["safety"]
    health = get(multi, "/health")
    assert health.status_code == 200
    assert health.json()["instances"]["safety"]["status"] == "asleep"
    refused = post(multi, "/generate", {"messages": [USER], "route_key": "safety"})
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "instance_asleep"
    assert "Retry-After" in refused.headers
    assert post(multi, "/generate", {"messages": [USER], "route_key": "quality"}).is_success
    metrics = get(multi, "/metrics").text
    assert metric(metrics, "genrm_instance_asleep", route_key="safety") == 1
    r = post(multi, "/wake_up", None, params={"route_key": "safety"})
    assert r.status_code == 200 and r.json() == {"status": "awake", "route_keys": ["safety"]}
    assert post(multi, "/generate", {"messages": [USER], "route_key": "safety"}).is_success
    assert get(multi, "/health").json()["instances"]["safety"] == {"status": "healthy"}


def test_sleep_unknown_route_key_is_404(multi: ServeArgs) -> None:
    assert post(multi, "/sleep", {"route_key": "nope"}).status_code == 404


# ---- API key ---------------------------------------------------------------------------------


def test_api_key_is_enforced(solo: tuple[ServeArgs, Any]) -> None:
    args, _ = solo
    body = {"messages": [USER]}
    assert post(args, "/generate", body).status_code == 401
    wrong = post(args, "/generate", body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "unauthorized"
    assert get(args, "/metrics").status_code == 401
    assert post(args, "/generate", {"bad": 1}).status_code == 401  # before body validation
    ok = post(args, "/generate", body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200 and ok.json()["response"] == "1"


# ---- overload --------------------------------------------------------------------------------


def test_overload_is_429_with_retry_after(solo: tuple[ServeArgs, Any]) -> None:
    args, _ = solo
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=headers, timeout=60) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(f"{args.url}/generate", json={"messages": [USER]})
                        for _ in range(20)
                    )
                )
            )

    responses = asyncio.run(burst())
    codes = sorted(r.status_code for r in responses)
    # 1 in flight + 2 queued fit (more as the 0.3 s requests finish); the rest are refused.
    assert set(codes) == {200, 429} and codes.count(200) >= 3, codes
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["type"] == "overloaded"
    assert "max_queued_requests=2" in refused.json()["error"]["message"]


# ---- engine failure (last: it kills an engine) -------------------------------------------------


def _wait_health(args: ServeArgs, status: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        r = get(args, "/health")
        if r.status_code == status:
            return dict(r.json())
        assert time.monotonic() < deadline, f"health stayed {r.status_code}: {r.text}"
        time.sleep(0.05)


def test_killed_engine_fails_over_then_restarts_and_rejoins(multi: ServeArgs) -> None:
    engines = get(multi, "/engines").json()["instances"]["quality"]
    victim = engines[0]
    actor = ray.get_actor(victim["actor_name"], namespace=victim["namespace"])
    ray.kill(actor)
    # Traffic keeps flowing: a request that lands on the dead engine is retried on the other.
    for _ in range(6):
        r = post(multi, "/generate", {"messages": [USER], "route_key": "quality"})
        assert r.status_code == 200, r.text
        assert r.json()["meta"]["engine_id"] == "quality/1"
    down = _wait_health(multi, 503, 15)
    q = down["instances"]["quality"]
    assert q["status"] == "degraded" and q["engines_healthy"] == 1 and q["engines_total"] == 2
    assert down["instances"]["safety"] == {"status": "healthy"}
    _wait_health(multi, 200, 60)
    after = get(multi, "/engines").json()["instances"]["quality"]
    assert after[0]["restarts"] == 1 and after[0]["state"] == "healthy"
    seen = set()
    for _ in range(6):
        r = post(multi, "/generate", {"messages": [USER], "route_key": "quality"})
        assert r.status_code == 200
        seen.add(r.json()["meta"]["engine_id"])
    assert seen == {"quality/0", "quality/1"}


# ---- through genrm-client ---------------------------------------------------------------------


async def test_client_routes_by_key_and_reads_health(multi: ServeArgs) -> None:
    from genrm_client import AsyncGenRMClient

    async with AsyncGenRMClient(multi.url, max_retries=0) as client:
        assert (await client.health()).status == "healthy"
        text = await client.generate([USER], {"temperature": 0.0}, route_key="safety")
        assert text == "s|safety|safety/0"
        full = await client.generate_full([USER], route_key="quality")
        assert full.meta is not None and full.meta.route_key == "quality"


async def test_client_raises_unknown_route_key_at_once(multi: ServeArgs) -> None:
    from genrm_client import AsyncGenRMClient, UnknownRouteKeyError

    before = metric(get(multi, "/metrics").text, "genrm_unknown_route_key_requests_total")
    async with AsyncGenRMClient(multi.url, max_retries=5) as client:
        with pytest.raises(UnknownRouteKeyError) as info:
            await client.generate([USER], route_key="helpfulness")
    assert info.value.route_key == "helpfulness"
    assert "No GenRM instance registered for route_key=helpfulness" in str(info.value)
    after = metric(get(multi, "/metrics").text, "genrm_unknown_route_key_requests_total")
    assert after == before + 1  # one attempt: a 404 is never retried


async def test_client_retries_through_overload(solo: tuple[ServeArgs, Any]) -> None:
    from genrm_client import AsyncGenRMClient

    args, _ = solo
    before = get(args, "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    async with AsyncGenRMClient(args.url, api_key=API_KEY, max_retries=10, timeout=60) as c:
        texts = await asyncio.gather(*(c.generate([USER]) for _ in range(10)))
    assert texts == ["1"] * 10
    after = get(args, "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    labels = {"route_key": DEFAULT_ROUTE_KEY, "outcome": "overloaded"}
    # The service did refuse some of them (429) and the client's retries got them through.
    assert metric(after, "genrm_requests_total", **labels) > metric(
        before, "genrm_requests_total", **labels
    )


def test_engine_restarted_by_ray_is_started_again_and_rejoins(
    solo: tuple[ServeArgs, Any],
) -> None:
    args, handle = solo
    headers = {"Authorization": f"Bearer {API_KEY}"}
    assert post(args, "/generate", {"messages": [USER]}, headers=headers).status_code == 200
    assert ray.get(handle.stats.remote(), timeout=30)["batches"] > 0
    ray.kill(handle, no_restart=False)  # Ray restarts the actor; its model must be loaded again

    def started_afresh() -> bool:
        # The scripted engine restarts faster than a health poll can always see the outage
        # (503), so the proof is the actor itself: a new process (its counters from zero) that
        # the supervisor started again (a fresh actor is "created" until then).
        try:
            st = ray.get(handle.stats.remote(), timeout=10)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        return st["batches"] == 0 and st["state"] != "created"

    deadline = time.monotonic() + 60
    while not started_afresh():
        assert time.monotonic() < deadline, "the restarted actor was not started again"
        time.sleep(0.1)
    _wait_health(args, 200, 60)
    r = post(args, "/generate", {"messages": [USER]}, headers=headers)
    assert r.status_code == 200 and r.json()["response"] == "1"


def test_engines_slept_on_their_actors_answer_instance_asleep(
    solo: tuple[ServeArgs, Any],
) -> None:
    # rl-core's defer-swap may sleep judge engines directly, not through POST /sleep.
    args, handle = solo
    headers = {"Authorization": f"Bearer {API_KEY}"}
    ray.get(handle.sleep.remote(), timeout=30)
    try:
        r = post(args, "/generate", {"messages": [USER]}, headers=headers)
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "instance_asleep"
    finally:
        ray.get(handle.wake.remote(), timeout=30)
    r = post(args, "/generate", {"messages": [USER]}, headers=headers)
    assert r.status_code == 200


def test_an_engine_past_the_deadline_is_504_and_the_service_recovers(
    solo: tuple[ServeArgs, Any],
) -> None:
    args, handle = solo
    headers = {"Authorization": f"Bearer {API_KEY}"}
    slow_s = SOLO_TIMEOUT_S + 1.5
    ray.get(handle.control.remote("set_delay", slow_s), timeout=30)
    try:
        r = post(args, "/generate", {"messages": [USER]}, headers=headers)
        assert r.status_code == 504
        err = r.json()["error"]
        assert err["type"] == "timeout"
        assert f"request_timeout_s={SOLO_TIMEOUT_S}" in err["message"]
    finally:
        ray.get(handle.control.remote("set_delay", 0.3), timeout=30)
    time.sleep(slow_s - SOLO_TIMEOUT_S + 0.5)  # the engine finishes the slow batch it had started
    r = post(args, "/generate", {"messages": [USER]}, headers=headers)
    assert r.status_code == 200


# ---- bounds: body size, max_response_len -------------------------------------------------------


def test_a_body_over_the_limit_is_413_before_parsing(multi: ServeArgs) -> None:
    limit = multi.max_request_body_bytes
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (limit + 1) + b'"}]}'
    r = httpx.post(
        f"{multi.url}/generate",
        content=big,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["type"] == "request_too_large"
    assert f"max_request_body_bytes={limit}" in err["message"]
    # Not JSON at all, and over the limit: still 413 (nothing was parsed), not 422.
    junk = httpx.post(f"{multi.url}/generate", content=b"\xff" * (limit + 10), timeout=60)
    assert junk.status_code == 413
    ok = post(multi, "/generate", {"messages": [USER], "route_key": "safety"})
    assert ok.status_code == 200


def test_a_streamed_body_is_counted_and_refused_past_the_limit(multi: ServeArgs) -> None:
    limit = multi.max_request_body_bytes

    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(limit // 65536 + 2):
            yield b" " * 65536

    r = httpx.post(f"{multi.url}/generate_batch", content=chunks(), timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "request_too_large"
    # Just under the limit is read (and then judged on its merits: not JSON → 422).
    under = httpx.post(f"{multi.url}/generate", content=b" " * (limit - 1), timeout=60)
    assert under.status_code == 422


def test_max_response_len_over_max_context_len_is_422_naming_the_field(multi: ServeArgs) -> None:
    # quality: max_context_len 50
    r = post(
        multi,
        "/generate",
        {
            "messages": [USER],
            "route_key": "quality",
            "sampling_params": {"max_response_len": 10**12},
        },
    )
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["type"] == "invalid_request"
    assert f"sampling_params.max_response_len={10**12}" in err["message"]
    assert "max_context_len=50" in err["message"]
    at = post(
        multi,
        "/generate",
        {"messages": [USER], "route_key": "quality", "sampling_params": {"max_response_len": 50}},
    )
    assert at.status_code == 200
    batch = post(
        multi,
        "/generate_batch",
        {
            "requests": [
                {"messages": [USER], "route_key": "quality"},
                {
                    "messages": [USER],
                    "route_key": "quality",
                    "sampling_params": {"max_response_len": 51},
                },
            ]
        },
    )
    assert batch.status_code == 200
    first, second = batch.json()["results"]
    assert first["response"].startswith("q|quality|")
    assert second["error"]["type"] == "invalid_request"
    assert "requests[1].sampling_params.max_response_len=51" in second["error"]["message"]
    chat = post(
        multi,
        "/v1/chat/completions",
        {"model": "quality", "messages": [USER], "max_tokens": 10**12},
    )
    assert chat.status_code == 422
    assert f"max_tokens={10**12}" in chat.json()["error"]["message"]


# ---- an engine restart is a delay; an engine that cannot start fails the start -----------------


async def test_requests_wait_for_a_killed_engine_to_be_recreated(multi: ServeArgs) -> None:
    """safety has one engine: with it killed, requests sent at once (some reach the dead actor,
    some arrive while it is re-created) are all answered by the new one, none fails."""
    (victim,) = get(multi, "/engines").json()["instances"]["safety"]
    ray.kill(ray.get_actor(victim["actor_name"], namespace=victim["namespace"]))
    body = {"messages": [USER], "route_key": "safety"}
    async with httpx.AsyncClient(base_url=multi.url, timeout=60.0) as client:
        replies = await asyncio.gather(*(client.post("/generate", json=body) for _ in range(8)))
    assert [r.status_code for r in replies] == [200] * 8, [r.text for r in replies]
    assert {r.json()["response"] for r in replies} == {"s|safety|safety/0"}
    (after,) = get(multi, "/engines").json()["instances"]["safety"]
    assert after["restarts"] == victim["restarts"] + 1 and after["state"] == "healthy"


def test_an_engine_that_cannot_start_fails_the_service_start_with_its_error(
    serve_port: int,
) -> None:
    """Its start fails, it is re-created, the start fails again: the wait ends at once with the
    engine's own error (not at the 30-minute start deadline), and the engine is not re-created
    again."""
    from ray import serve

    instances = build_instances(model_path="/no/such/judge-script.json", engine="scripted")
    args = ServeArgs(
        port=serve_port,
        app_name="broken",
        route_prefix="/broken/genrm",
        api_key=None,
        engine_num_cpus=0.1,
        health_check_period_s=0.5,
        restart_backoff_s=0.5,
    )
    deploy(build_app(instances, args=args), args)
    start = time.monotonic()
    try:
        with pytest.raises(EngineStartError, match=r"__default__/0: failed .*judge-script\.json"):
            wait_until_healthy(args, 600)
        assert time.monotonic() - start < 60
        (engine,) = get(args, "/engines").json()["instances"][DEFAULT_ROUTE_KEY]
        assert engine["state"] == "failed" and engine["restarts"] == 1
        refused = post(args, "/generate", {"messages": [USER]})
        assert refused.status_code == 503 and "judge-script.json" in refused.text
    finally:
        serve.delete("broken")


# ---- one retry owner -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def failing(serve_port: int) -> Iterator[ServeArgs]:
    """Engines that answer every generate with an error (but pass their health probes)."""
    instances = build_instances(
        instances={
            "pair": {"model_path": scripted_model_path(fail_every=1), "num_gpus": 2},
            "single": {"model_path": scripted_model_path(fail_every=1), "num_gpus": 1},
        },
        engine="scripted",
    )
    args = ServeArgs(
        port=serve_port,
        app_name="failing",
        route_prefix="/failing/genrm",
        api_key=None,
        engine_num_cpus=0.1,
        health_check_period_s=0.5,
    )
    deploy(build_app(instances, args=args), args)
    wait_until_healthy(args, 120)
    yield args


def _engine_calls(args: ServeArgs, route_key: str) -> int:
    total = 0
    for s in get(args, "/engines").json()["instances"][route_key]:
        actor = ray.get_actor(s["actor_name"], namespace=s["namespace"])
        total += int(ray.get(actor.stats.remote(), timeout=30)["calls"])
    return total


async def test_a_failed_over_request_is_not_retried_by_the_client(failing: ServeArgs) -> None:
    from genrm_client import AsyncGenRMClient, GenRMHTTPError

    before = _engine_calls(failing, "pair")
    async with AsyncGenRMClient(failing.url, max_retries=3, timeout=60) as client:
        with pytest.raises(GenRMHTTPError) as info:
            await client.generate([USER], route_key="pair")
    assert info.value.status == 503
    assert "1 attempt(s)" in str(info.value)  # x-should-retry: false was honoured
    # Once on each engine (the router's failover), never again: 2, not (1 + 3) x 2 = 8.
    assert _engine_calls(failing, "pair") - before == 2
    r = post(failing, "/generate", {"messages": [USER], "route_key": "pair"})
    assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
    assert "retry-after" not in r.headers


async def test_with_no_engine_to_fail_over_to_the_client_owns_the_retry(
    failing: ServeArgs,
) -> None:
    from genrm_client import AsyncGenRMClient, GenRMHTTPError

    before = _engine_calls(failing, "single")
    async with AsyncGenRMClient(failing.url, max_retries=2, timeout=60) as client:
        with pytest.raises(GenRMHTTPError) as info:
            await client.generate([USER], route_key="single")
    assert info.value.status == 503
    # One engine: the router cannot fail over, so each of the 1 + 2 client attempts ran once.
    assert _engine_calls(failing, "single") - before == 3
    r = post(failing, "/generate", {"messages": [USER], "route_key": "single"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "x-should-retry" not in r.headers
