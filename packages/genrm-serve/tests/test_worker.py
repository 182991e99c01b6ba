"""EngineWorker as a real Ray actor: micro-batching, ordering, lifecycle, placement."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

# Ray's environment is set by conftest.py (genrm_serve.testing.ray_test_env) before this import.
import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.worker import EngineWorker, create_engine_worker
from genrm_serve.testing import build_tiny_model, scripted_model_path

TIMEOUT = 60


def _spec(script: dict[str, object], **engine_config: object) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=scripted_model_path(**script),
        num_gpus=1,
        engine_config=EngineConfig(**engine_config),  # type: ignore[arg-type]
    )


def _req(text: str) -> EngineRequest:
    return EngineRequest(sampling=SamplingParams(), messages=[Message(role="user", content=text)])


async def _started(spec: InstanceSpec, index: int = 0, **kw: object) -> object:
    handle = create_engine_worker(spec, index, **kw)  # type: ignore[arg-type]
    await asyncio.wait_for(handle.start.remote(), TIMEOUT)
    return handle


async def test_concurrent_calls_are_batched_and_answered_in_order(shared_ray: None) -> None:
    handle = await _started(_spec({"default": "{last_user}", "delay_s": 0.2}, max_batch_size=8))
    n = 24
    refs = [handle.generate.remote(_req(f"q{i}")) for i in range(n)]  # type: ignore[attr-defined]
    outs = await asyncio.wait_for(asyncio.gather(*refs), TIMEOUT)
    assert [o.text for o in outs] == [f"q{i}" for i in range(n)]
    stats = await handle.stats.remote()  # type: ignore[attr-defined]
    assert stats["succeeded"] == n
    assert stats["batches"] < n / 2, stats
    assert 1 < stats["max_batch"] <= 8
    assert all(o.extra["batch_size"] <= 8 for o in outs)
    assert outs[0].extra["engine_id"] == "judge/0" and outs[0].latency_s > 0
    many = await asyncio.wait_for(
        handle.generate_many.remote([_req(f"m{i}") for i in range(5)]),  # type: ignore[attr-defined]
        TIMEOUT,
    )
    assert [o.text for o in many] == [f"m{i}" for i in range(5)]
    ray.kill(handle)


async def test_one_long_prompt_does_not_fail_its_batch(shared_ray: None) -> None:
    handle = await _started(_spec({"delay_s": 0.05}, max_context_len=5))
    texts = ["short", "far too many words in this prompt here", "short too"]
    results = await asyncio.gather(
        *(handle.generate.remote(_req(t)) for t in texts),  # type: ignore[attr-defined]
        return_exceptions=True,
    )
    assert results[0].text == "1" and results[2].text == "1"  # type: ignore[union-attr]
    err = results[1]
    assert isinstance(err, PromptTooLongError), err
    assert (err.prompt_tokens, err.max_context_len) == (8, 5)
    ray.kill(handle)


async def test_sleep_wake_health_and_failure_injection(shared_ray: None) -> None:
    handle = await _started(_spec({}))
    h: object = handle
    await asyncio.wait_for(h.check_health.remote(), TIMEOUT)  # type: ignore[attr-defined]
    await asyncio.wait_for(h.sleep.remote(), TIMEOUT)  # type: ignore[attr-defined]
    assert (await h.stats.remote())["state"] == "asleep"  # type: ignore[attr-defined]
    with pytest.raises(EngineAsleepError):
        await asyncio.wait_for(h.generate.remote(_req("x")), TIMEOUT)  # type: ignore[attr-defined]
    await asyncio.wait_for(h.check_health.remote(), TIMEOUT)  # type: ignore[attr-defined]
    await asyncio.wait_for(h.wake.remote(), TIMEOUT)  # type: ignore[attr-defined]
    out = await asyncio.wait_for(h.generate.remote(_req("x")), TIMEOUT)  # type: ignore[attr-defined]
    assert out.text == "1"

    await h.control.remote("set_failing", True, "boom")  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="boom"):
        await asyncio.wait_for(h.generate.remote(_req("x")), TIMEOUT)  # type: ignore[attr-defined]
    await h.control.remote("set_failing", False)  # type: ignore[attr-defined]
    await h.control.remote("set_healthy", False)  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="unhealthy"):
        await asyncio.wait_for(h.check_health.remote(), TIMEOUT)  # type: ignore[attr-defined]
    with pytest.raises(EngineError, match="no control method"):
        await h.control.remote("shutdown")  # type: ignore[attr-defined]

    version = await h.update_weights.remote({"w": 0}, 3)  # type: ignore[attr-defined]
    assert version == 3
    out = await asyncio.wait_for(h.generate.remote(_req("x")), TIMEOUT)  # type: ignore[attr-defined]
    assert out.weight_version == 3
    ray.kill(handle)


async def test_worker_goes_into_the_given_bundle(shared_ray: None) -> None:
    pg = placement_group([{"CPU": 0.2}, {"CPU": 0.3}], strategy="PACK")
    await asyncio.wait_for(pg.ready(), TIMEOUT)
    try:
        handle = await _started(_spec({}), 1, placement_group=pg, bundle_index=1, num_cpus=0.3)
        info = await handle.info.remote()  # type: ignore[attr-defined]
        assert info["engine_id"] == "judge/1" and info["engine"] == "ScriptedEngine"
        assert info["placement_group_id"] == pg.id.hex()
        assert info["gpu_ids"] == []  # the bundle holds no GPU: the engine asked for none
        ray.kill(handle)
    finally:
        remove_placement_group(pg)


@pytest.mark.parametrize(
    ("engine", "device", "cluster_gpus", "expected"),
    [
        pytest.param("hf", "auto", True, True, id="gpu-engine-on-a-gpu-cluster"),
        pytest.param("hf", "cpu", True, False, id="cpu-device-asks-no-gpu"),
        pytest.param("scripted", "auto", True, False, id="scripted-never-asks"),
        pytest.param("hf", "auto", False, False, id="no-gpus-in-the-cluster"),
    ],
)
def test_an_engine_asks_for_gpus_only_when_it_computes_on_one(
    engine: str, device: str, cluster_gpus: bool, expected: bool
) -> None:
    from genrm_serve.config import InstanceSpec
    from genrm_serve.engine_refs import instance_bundles, needs_gpus

    spec = InstanceSpec(
        route_key="j",
        model_path="/models/judge",
        num_gpus=2,
        engine=engine,
        engine_config=EngineConfig(device=device),
    )
    assert needs_gpus(spec, cluster_gpus) is expected
    bundles = instance_bundles(spec, with_gpus=expected, engine_num_cpus=0.1)
    assert [b.get("GPU", 0.0) for b in bundles] == [1.0 if expected else 0.0] * 2


async def test_in_process_worker_without_ray() -> None:
    worker = EngineWorker(_spec({"default": "{last_user}"}), 0)
    await worker.start()
    outs = await worker.generate_many([_req(f"r{i}") for i in range(4)])
    assert [o.text for o in outs] == ["r0", "r1", "r2", "r3"]
    assert (await worker.stats())["batches"] == 1
    with pytest.raises(EngineError, match="not started"):
        await EngineWorker(_spec({}), 1).generate(_req("x"))
    await worker.shutdown()


async def test_hf_engine_in_an_actor_batches_real_forward_passes(
    shared_ray: None, tmp_path: Path
) -> None:
    tiny = build_tiny_model(tmp_path / "tiny")
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(tiny),
        num_gpus=1,
        engine="hf",
        # a CPU test says so: on a GPU host the actor then asks Ray for no GPU
        engine_config=EngineConfig(max_batch_size=8, device="cpu"),
        sampling_config=SamplingParams(temperature=0.0, max_response_len=3).merged_over(
            DEFAULT_SAMPLING
        ),
    )
    handle = create_engine_worker(spec, 0)
    h: Any = handle
    slow = 240  # an actor importing torch on a busy 2-core machine
    await asyncio.wait_for(h.start.remote(), slow)
    prompts = [f"Is {i} equal to {i}? " * 3 for i in range(12)]
    # generate_many's 12 stay one engine batch (a group is not split by the batcher); the
    # engine runs it as two forward passes of at most 8 rows
    outs = await asyncio.wait_for(h.generate_many.remote([_req(p) for p in prompts]), slow)
    assert all(o.completion_tokens == 3 or o.finish_reason == "stop" for o in outs)
    assert [o.extra["batch_size"] for o in outs] == [12] * 12
    stats = await h.stats.remote()
    assert (stats["batches"], stats["max_batch"], stats["chunks"]) == (1, 12, 2), stats
    assert stats["device"] == "cpu"
    assert stats["torch_threads"] == len(os.sched_getaffinity(0))  # not Ray's OMP_NUM_THREADS=1
    alone = await asyncio.wait_for(h.generate.remote(_req(prompts[5])), slow)
    assert alone.extra["batch_size"] == 1
    await asyncio.wait_for(h.sleep.remote(), slow)
    await asyncio.wait_for(h.wake.remote(), slow)
    again = await asyncio.wait_for(h.generate.remote(_req(prompts[5])), slow)
    assert again.text == alone.text  # the weights came back
    ray.kill(handle)


class _RecordingEngine(Engine):
    """Answers each request with its id and records which ids shared an engine batch."""

    def __init__(self, spec: InstanceSpec) -> None:
        super().__init__(spec, "judge/0")
        self.batches: list[list[str]] = []

    async def start(self) -> None:
        self.state = "awake"

    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        self.batches.append([str(r.request_id) for r in requests])
        await asyncio.sleep(0.02)  # the next calls queue up meanwhile
        return [EngineOutput(str(r.request_id), "stop", 1, 1) for r in requests]

    async def sleep(self) -> None:
        self.state = "asleep"

    async def wake(self) -> None:
        self.state = "awake"


async def test_a_group_sent_together_is_never_split_across_engine_batches() -> None:
    """GRPO groups arrive as ``generate_many`` calls: each lands in one engine batch, whole
    groups fill a batch up to ``max_batch_size``, and a group larger than that goes alone."""
    spec = _spec({}, max_batch_size=8)
    engine = _RecordingEngine(spec)
    worker = EngineWorker(spec, 0, engine=engine, batch_wait_s=0.05)
    await worker.start()

    def group(name: str, n: int) -> list[EngineRequest]:
        return [
            EngineRequest(sampling=SamplingParams(), request_id=f"{name}{i}", messages=[])
            for i in range(n)
        ]

    sizes = {"a": 5, "b": 5, "c": 3, "d": 12, "e": 2, "f": 6}
    calls = [worker.generate_many(group(name, n)) for name, n in sizes.items()]
    singles = [worker.generate(group(f"s{i}-", 1)[0]) for i in range(3)]
    results = await asyncio.gather(*calls, *singles)
    assert [o.text for o in results[0]] == [f"a{i}" for i in range(5)]  # answers in order
    where = {rid: b for b, batch in enumerate(engine.batches) for rid in batch}
    for name, n in sizes.items():
        assert len({where[f"{name}{i}"] for i in range(n)}) == 1, (name, engine.batches)
    assert [len(b) for b in engine.batches if "d0" in b] == [12]  # over the limit: alone
    assert all(len(b) <= 8 for b in engine.batches if "d0" not in b)
    assert len(engine.batches) <= 6  # groups were packed together, not one batch each
    stats = await worker.stats()
    assert stats["queue_depth"] == 0 and stats["succeeded"] == sum(sizes.values()) + 3
    await worker.shutdown()


async def test_a_burst_of_single_requests_waits_for_its_last_one_up_to_the_limit() -> None:
    """Concurrent single requests reach the actor one by one (each through HTTP and the ingress):
    each arrival within ``batch_wait_s`` of the last keeps the batch open, so a burst is one
    batch, not a first batch of the few that came first with the rest queued behind it; a
    steady trickle is still cut at ``batch_wait_max_s`` from the batch's first request."""
    spec = _spec({}, max_batch_size=64, batch_wait_ms=50, batch_wait_max_ms=2000)
    engine = _RecordingEngine(spec)
    worker = EngineWorker(spec, 0, engine=engine)
    await worker.start()

    def one(name: str) -> EngineRequest:
        return EngineRequest(sampling=SamplingParams(), request_id=name, messages=[])

    async def trickle(prefix: str, n: int, gap_s: float) -> None:
        calls = []
        for i in range(n):
            calls.append(asyncio.ensure_future(worker.generate(one(f"{prefix}{i}"))))
            await asyncio.sleep(gap_s)
        await asyncio.gather(*calls)

    await trickle("burst", 30, 0.005)  # ~150 ms of arrivals: longer than one wait, in one batch
    assert [len(b) for b in engine.batches] == [30], engine.batches

    engine.batches.clear()
    worker.batch_wait_s, worker.batch_wait_max_s = 0.1, 0.15
    await trickle("steady", 20, 0.02)  # ~400 ms of arrivals, each 20 ms after the last
    first = engine.batches[0]
    assert 1 < len(first) < 20, engine.batches  # kept open past its first, cut at the limit
    assert sum(len(b) for b in engine.batches) == 20
    await worker.shutdown()


async def test_a_request_waits_in_the_actor_only_for_the_time_it_carries() -> None:
    """The router sends each request with the time left of its deadline: behind a busy engine it
    fails then, with the timeout error, not after the worker's own full request deadline."""
    from genrm_serve.engines.base import EngineTimeoutError

    worker = EngineWorker(_spec({"default": "ok", "delay_s": 5.0}), 0, request_timeout_s=30.0)
    await worker.start()
    try:
        busy = asyncio.ensure_future(worker.generate(_req("busy")))
        await asyncio.sleep(0.05)
        late = _req("late")
        late.timeout_s = 0.3
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(EngineTimeoutError, match="timed out"):
            await worker.generate(late)
        assert loop.time() - start < 2.0  # its 0.3 s, not the engine's 5 s batch nor 30 s
        busy.cancel()
    finally:
        await worker.shutdown()
