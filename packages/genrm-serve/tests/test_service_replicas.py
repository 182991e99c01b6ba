"""Several ingress replicas over one set of engines: real Ray Serve, HTTP, the scripted engine.

Serve spreads the requests over the replicas; each keeps its own routing state. What a user
must still see is one service: the engines created once (by the leader), every request
answered, one sleep and one wake whichever replica takes them, metrics that add up whichever
replica a scrape reaches, and a killed engine re-created once and found again by every replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import ray
from prometheus_client import generate_latest
from ray import serve
from ray.serve.schema import ReplicaState  # type: ignore[attr-defined]
from service_calls import USER, get, metric, post

from genrm_client.types import DEFAULT_ROUTE_KEY
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.metrics import ServiceMetrics
from genrm_serve.metrics_hub import PUBLISH_PERIOD_S, merge_expositions
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import scripted_model_path

APP = "replicas"
REPLICAS = 2


@pytest.fixture(scope="module")
def service(serve_port: int) -> Iterator[ServeArgs]:
    instances = build_instances(
        model_path=scripted_model_path(default="1|{engine_id}"),
        num_gpus=2,
        engine="scripted",
        engine_config={"max_batch_size": 8},
    )
    args = ServeArgs(
        port=serve_port,
        app_name=APP,
        api_key=None,
        engine_num_cpus=0.1,
        ingress_replicas=REPLICAS,
        health_check_period_s=0.5,
        probe_timeout_s=5.0,
        restart_backoff_s=1.0,
    )
    deploy(build_app(instances, args=args), args)
    wait_until_healthy(args, 120)
    yield args


def _burst(args: ServeArgs, n: int) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=args.url, timeout=60) as client:
            body = {"messages": [USER]}
            return list(
                await asyncio.gather(*(client.post("/generate", json=body) for _ in range(n)))
            )

    return asyncio.run(go())


def _every_replica(args: ServeArgs, path: str, want: Any, timeout_s: float = 15.0) -> None:
    """``want(response)`` holds for 8 answers in a row (Serve spreads them over the replicas)."""
    deadline = time.monotonic() + timeout_s
    in_row = 0
    while in_row < 8:
        r = get(args, path)
        in_row = in_row + 1 if want(r) else 0
        assert time.monotonic() < deadline, f"{path}: {r.status_code} {r.text}"
        if not in_row:
            time.sleep(0.1)


def test_the_replicas_run_and_the_engines_are_created_once(service: ServeArgs) -> None:
    status = serve.status().applications[APP].deployments["GenRMIngress"]
    assert status.replica_states.get(ReplicaState.RUNNING) == REPLICAS
    named: list[Any] = ray.util.list_named_actors(all_namespaces=True)
    engines = sorted(a["name"] for a in named if APP in a["name"])
    assert [e for e in engines if e.startswith("genrm-engine")] == [
        f"genrm-engine:{APP}:{DEFAULT_ROUTE_KEY}:0",
        f"genrm-engine:{APP}:{DEFAULT_ROUTE_KEY}:1",
    ]
    responses = _burst(service, 64)
    assert [r.status_code for r in responses] == [200] * 64
    used = {r.json()["meta"]["engine_id"] for r in responses}
    assert used == {f"{DEFAULT_ROUTE_KEY}/0", f"{DEFAULT_ROUTE_KEY}/1"}


def test_metrics_add_up_over_the_replicas(service: ServeArgs) -> None:
    ok = {"route_key": DEFAULT_ROUTE_KEY, "outcome": "success"}
    time.sleep(2 * PUBLISH_PERIOD_S)
    before = metric(get(service, "/metrics").text, "genrm_requests_total", **ok)
    assert all(r.status_code == 200 for r in _burst(service, 40))
    time.sleep(2 * PUBLISH_PERIOD_S)
    for _ in range(6):  # whichever replica answers the scrape
        text = get(service, "/metrics").text
        assert metric(text, "genrm_requests_total", **ok) == before + 40
        assert metric(text, "genrm_engines_total", route_key=DEFAULT_ROUTE_KEY) == 2
        assert metric(text, "genrm_engines_healthy", route_key=DEFAULT_ROUTE_KEY) == 2
        latency = metric(text, "genrm_request_latency_seconds_count", route_key=DEFAULT_ROUTE_KEY)
        assert latency == before + 40


def test_one_sleep_and_one_wake_hold_on_every_replica(service: ServeArgs) -> None:
    assert post(service, "/sleep", None).status_code == 200
    refused = _burst(service, 16)
    assert {r.status_code for r in refused} == {503}, [r.text for r in refused]
    assert {r.json()["error"]["type"] for r in refused} == {"instance_asleep"}
    asleep = {"status": "asleep", "engines_total": 2, "engines_healthy": 2}
    _every_replica(
        service, "/health", lambda r: r.json().get("instances") == {DEFAULT_ROUTE_KEY: asleep}
    )
    assert post(service, "/wake_up", None).status_code == 200
    # Awake at once for every replica, also one that last saw the engines asleep.
    assert [r.status_code for r in _burst(service, 16)] == [200] * 16
    _every_replica(
        service, "/health", lambda r: r.json() == {"status": "healthy", "service": "genrm"}
    )


def test_a_killed_engine_is_recreated_once_and_every_replica_finds_it(
    service: ServeArgs,
) -> None:
    victim = get(service, "/engines").json()["instances"][DEFAULT_ROUTE_KEY][0]
    name, namespace = victim["actor_name"], victim["namespace"]
    old = ray.get_actor(name, namespace=namespace)
    old_pid = ray.get(old.info.remote())["pid"]  # type: ignore[call-overload]
    ray.kill(old)
    # Requests keep being answered: the other engine takes them.
    assert [r.status_code for r in _burst(service, 16)] == [200] * 16
    _every_replica(service, "/health", lambda r: r.status_code == 200, timeout_s=60)
    new = ray.get_actor(name, namespace=namespace)
    assert ray.get(new.info.remote())["pid"] != old_pid
    responses = _burst(service, 64)
    assert [r.status_code for r in responses] == [200] * 64
    assert {r.json()["meta"]["engine_id"] for r in responses} == {
        f"{DEFAULT_ROUTE_KEY}/0",
        f"{DEFAULT_ROUTE_KEY}/1",
    }
    time.sleep(2 * PUBLISH_PERIOD_S)
    text = get(service, "/metrics").text
    assert metric(text, "genrm_engine_restarts", route_key=DEFAULT_ROUTE_KEY) == 1


def test_merged_metrics_sum_the_requests_and_count_the_engines_once() -> None:
    expositions = []
    for latencies in ([0.01, 0.2], [0.02, 0.03, 3.0]):  # two replicas' requests
        prom = ServiceMetrics()
        prom.prime(["j"])
        for s in latencies:
            prom.observe("j", "success", s, prompt_tokens=10, completion_tokens=1)
        prom.engines_total.labels(route_key="j").set(2)
        expositions.append(generate_latest(prom.registry))
    merged = merge_expositions(expositions).decode()
    assert metric(merged, "genrm_requests_total", route_key="j", outcome="success") == 5
    assert metric(merged, "genrm_prompt_tokens_total", route_key="j") == 50
    assert metric(merged, "genrm_request_latency_seconds_count", route_key="j") == 5
    assert metric(merged, "genrm_request_latency_seconds_bucket", route_key="j", le="0.025") == 2
    latency_sum = metric(merged, "genrm_request_latency_seconds_sum", route_key="j")
    assert latency_sum == pytest.approx(3.26)
    assert metric(merged, "genrm_engines_total", route_key="j") == 2  # the same engines
