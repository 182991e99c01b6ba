"""Prefix-key affinity: a key's requests go to one engine, bounded by load, remapped only when
their engine goes down; through the real router and real (scripted) engine workers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import EngineConfig, InstanceSpec
from genrm_serve.engine_refs import EngineRef
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.worker import EngineWorker
from genrm_serve.metrics import ServiceMetrics
from genrm_serve.router import EngineSlot, InstanceRouter
from genrm_serve.router.chunking import chunk_by_key
from genrm_serve.router.policy import affinity_slack, serving_home
from genrm_serve.testing import scripted_model_path


def _spec(engines: int, script: dict[str, object] | None = None, **config: Any) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=scripted_model_path(**(script or {"default": "{engine_id}"})),
        num_gpus=engines,
        engine_config=EngineConfig(**config),
    )


def _router(engines: int = 4, limit: int = 64, **config: Any) -> InstanceRouter:
    spec = _spec(engines, max_queued_requests=256, **config)
    slots = [EngineSlot(route_key="judge", index=i, ref=EngineRef()) for i in range(engines)]
    for s in slots:
        s.state = "healthy"
    return InstanceRouter(spec, slots, inflight_limit=limit, request_timeout_s=5.0)


def _request(text: str, key: str | None) -> EngineRequest:
    return EngineRequest(
        sampling=SamplingParams(temperature=0.0),
        messages=[Message(role="user", content=text)],
        prefix_key=key,
    )


async def _home_now(r: InstanceRouter, key: str) -> EngineSlot:
    slot = await r.acquire(key=key)
    r.release(slot)
    return slot


# ---- the pick rule -----------------------------------------------------------------------------


async def test_the_same_key_goes_to_the_same_engine_whatever_the_other_load() -> None:
    r = _router(engines=4)
    first = await _home_now(r, "group-1")
    others = [await r.acquire() for _ in range(3)]  # keyless load elsewhere
    assert [await _home_now(r, "group-1") for _ in range(10)] == [first] * 10
    for slot in others:
        r.release(slot)
    assert r.affinity_home == 11 and r.affinity_spilled == 0


async def test_a_busy_home_spills_to_the_least_loaded_engine_and_is_counted() -> None:
    r = _router(engines=2, limit=64)
    assert r.affinity_slack == affinity_slack(64) == 8
    home = await _home_now(r, "g")
    other = r.slots[1 - home.index]
    held = [await r.acquire(key="g") for _ in range(9)]  # 0..8 ahead of the other: still home
    assert all(s is home for s in held)
    assert (home.in_flight, other.in_flight) == (9, 0)
    spilled = await r.acquire(key="g")  # 9 > 0 + 8: clearly busier
    assert spilled is other
    assert (r.affinity_home, r.affinity_spilled) == (10, 1)
    back = await r.acquire(key="g")  # 9 <= 1 + 8: home again
    assert back is home
    for s in [*held, spilled, back]:
        r.release(s)
    assert r.in_flight == 0


async def test_a_full_home_is_never_waited_for_while_another_engine_has_room() -> None:
    r = _router(engines=2, limit=2)
    home = await _home_now(r, "g")
    held = [await r.acquire(key="g"), await r.acquire(key="g")]
    assert held == [home, home]
    elsewhere = await asyncio.wait_for(r.acquire(key="g"), 1.0)
    assert elsewhere is not home and r.affinity_spilled == 1
    for s in [*held, elsewhere]:
        r.release(s)


async def test_an_engine_going_down_moves_only_its_keys_and_back_up_takes_them_back() -> None:
    r = _router(engines=4)
    keys = [f"group-{i}" for i in range(400)]
    before = {k: await _home_now(r, k) for k in keys}
    down = r.slots[2]
    r.set_state(down, "dead", "test")
    during = {k: await _home_now(r, k) for k in keys}
    moved = [k for k in keys if during[k] is not before[k]]
    assert moved and set(moved) == {k for k in keys if before[k] is down}
    assert len({during[k].engine_id for k in moved}) == 3  # spread over the other three
    r.set_state(down, "healthy")
    assert {k: await _home_now(r, k) for k in keys} == before


async def test_a_waiting_keyed_request_takes_its_home_or_whichever_engine_frees_first() -> None:
    for free_home_first in (True, False):
        r = _router(engines=2, limit=1)
        home = await _home_now(r, "g")
        other = r.slots[1 - home.index]
        assert {(await r.acquire()).index, (await r.acquire()).index} == {0, 1}  # both full
        waiting = asyncio.ensure_future(r.acquire(key="g"))
        await asyncio.sleep(0)
        r.release(home if free_home_first else other)
        # the home when it frees; otherwise the other engine at once (a full home is not waited
        # for: affinity never makes a request wait longer than load alone would)
        got = await asyncio.wait_for(waiting, 1.0)
        assert got is (home if free_home_first else other)
        assert (r.affinity_home, r.affinity_spilled) == ((2, 0) if free_home_first else (1, 1))


def test_metrics_show_home_and_spilled_requests() -> None:
    r = _router(engines=2)
    r.affinity_home, r.affinity_spilled = 7, 2
    text = ServiceMetrics().render({"judge": r}).decode()
    assert 'genrm_affinity_requests{route_key="judge",routed="home"} 7.0' in text
    assert 'genrm_affinity_requests{route_key="judge",routed="spilled"} 2.0' in text


# ---- through the router, on real engine workers --------------------------------------------------


class _Method:
    def __init__(self, fn: Callable[..., Awaitable[Any]], log: list[int]) -> None:
        self.fn = fn
        self.log = log

    def remote(self, payload: Any, **kwargs: Any) -> Awaitable[Any]:
        self.log.append(len(payload) if isinstance(payload, list) else 1)
        return asyncio.ensure_future(self.fn(payload, **kwargs))


class _LocalActor:
    """An in-process ``EngineWorker`` behind the actor-call shape the router uses."""

    def __init__(self, worker: EngineWorker) -> None:
        self.worker = worker
        self.calls: list[int] = []  # the requests of each engine call
        self.generate = _Method(worker.generate, self.calls)
        self.generate_many = _Method(worker.generate_many, self.calls)


async def _served_router(engines: int, **config: Any) -> tuple[InstanceRouter, list[EngineWorker]]:
    r = _router(engines=engines, **config)
    script = {"default": "{engine_id}", "delay_s": 0.005}
    workers = [EngineWorker(_spec(engines, script, **config), i) for i in range(engines)]
    for slot, worker in zip(r.slots, workers, strict=True):
        await worker.start()
        slot.handle = _LocalActor(worker)
    return r, workers


async def _spread_arrivals(r: InstanceRouter, keyed: bool) -> dict[int, set[str]]:
    """6 groups of 8; each group's samples finish one by one, interleaved with the others."""
    groups, size = 6, 8

    async def one(g: int, m: int) -> tuple[int, str]:
        req = _request(f"group {g} sample {m}", f"group-{g}" if keyed else None)
        out, slot = await r.generate(req)
        assert out.text == slot.engine_id  # the engine that answered is the one chosen
        return g, out.text

    tasks = []
    for m in range(size):
        for g in range(groups):
            tasks.append(asyncio.ensure_future(one(g, m)))
            await asyncio.sleep(0.002)  # rollouts finish over time, not together
    engines: dict[int, set[str]] = {g: set() for g in range(groups)}
    for g, engine_id in await asyncio.gather(*tasks):
        engines[g].add(engine_id)
    return engines


async def test_spread_arrivals_of_a_group_all_reach_one_engine() -> None:
    r, workers = await _served_router(4)
    try:
        by_load = await _spread_arrivals(r, keyed=False)
        assert any(len(e) > 1 for e in by_load.values())  # load alone splits groups
        keyed = await _spread_arrivals(r, keyed=True)
        assert all(len(e) == 1 for e in keyed.values()), keyed
        assert len(set.union(*keyed.values())) > 1  # and groups still use several engines
        assert (r.affinity_home, r.affinity_spilled) == (48, 0)
        # a later request of a group (a straggler) lands where the group's prefix is cached
        out, _ = await r.generate(_request("group 3 straggler", "group-3"))
        assert {out.text} == keyed[3]
    finally:
        for w in workers:
            await w.shutdown()


async def test_a_batch_keeps_each_group_in_one_engine_call_on_its_home() -> None:
    r, workers = await _served_router(3, max_batch_size=8)
    try:
        homes = {g: serving_home(f"group-{g}", r.slots) for g in range(5)}
        requests = [
            _request(f"group {g} sample {m}", f"group-{g}") for m in range(4) for g in range(5)
        ] + [_request("loose 1", None), _request("loose 2", None)]
        results = await r.generate_many(requests)
        assert len(results) == len(requests)
        for req, res in zip(requests, results, strict=True):
            assert isinstance(res, tuple)
            out, slot = res
            assert out.text == slot.engine_id
            if req.prefix_key is not None:
                g = int(req.prefix_key.split("-")[1])
                assert slot is homes[g]  # every member of a group on the group's home
        calls = [size for w in r.slots for size in w.handle.calls]
        assert sum(calls) == len(requests) and max(calls) <= 8
        chunks = chunk_by_key([q.prefix_key for q in requests], r.slots, 8)
        for chunk in chunks:  # no group cut in two: groups of 4 fit a batch of 8
            keys = {requests[i].prefix_key for i in chunk}
            for key in keys - {None}:
                assert all(
                    requests[i].prefix_key != key for c in chunks if c is not chunk for i in c
                )
    finally:
        for w in workers:
            await w.shutdown()


def test_a_group_larger_than_a_batch_is_cut_only_at_the_batch_size() -> None:
    r = _router(engines=2)
    keys = ["big"] * 10 + [None]
    assert chunk_by_key(keys, r.slots, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [10]]
    assert chunk_by_key([None] * 6, r.slots, 4) == [[0, 1, 2, 3], [4, 5]]  # no keys: in order
