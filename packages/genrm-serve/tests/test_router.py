"""The instance router without Ray: admission (429 / 503), the wait for an engine slot, one
deadline per request, failover to another engine, batches and coalesced single requests.

Routers are built over engine slots; where a test needs an engine it is a small double of the
actor-call shape (``handle.generate_many.remote(...)``), never a Ray actor. Which engine is
chosen, on plain data, is ``test_router_policy.py``; prefix affinity through the router and real
engine workers is ``test_affinity.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import InstanceSpec, build_instances
from genrm_serve.engine_refs import EngineRef
from genrm_serve.engines.base import (
    EngineError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
    RequestRefusedError,
)
from genrm_serve.errors import ServiceError
from genrm_serve.health import health_report
from genrm_serve.router import EngineSlot, InstanceRouter


def _spec(key: str = "q", num_gpus: int = 2, **engine_config: int) -> InstanceSpec:
    return build_instances(
        instances={key: {"model_path": "scripted", "num_gpus": num_gpus}},
        engine_config=dict(engine_config) or None,
    )[key]


def _router(key: str = "q", engines: int = 2, limit: int = 2, queue: int = 3) -> InstanceRouter:
    spec = _spec(key, engines, max_queued_requests=queue)
    slots = [EngineSlot(route_key=key, index=i, ref=EngineRef()) for i in range(engines)]
    for s in slots:
        s.state = "healthy"
    return InstanceRouter(spec, slots, inflight_limit=limit, request_timeout_s=5.0)


# ---- the slot and its engine's face -----------------------------------------------------------


def test_a_slot_makes_its_engines_face_once_per_actor() -> None:
    slot = EngineSlot(route_key="q", index=1, ref=EngineRef())
    assert slot.handle is None
    with pytest.raises(RuntimeError, match="q/1 has no actor"):
        _ = slot.actor
    handle = object()
    slot.handle = handle  # the supervisor gives the slot an actor
    face = slot.actor
    assert face is slot.actor and face.handle is handle and face.engine_id == "q/1"
    slot.handle = None  # and takes it away (a re-creation)
    assert slot.handle is None


# ---- admission and engine choice -------------------------------------------------------------


async def test_least_loaded_engine_is_chosen_and_ties_alternate() -> None:
    r = _router(limit=4)
    first = await r.acquire()
    second = await r.acquire()
    assert {first.index, second.index} == {0, 1}
    r.release(first)
    third = await r.acquire()
    assert third is first  # now the least loaded
    assert r.in_flight == 2


async def test_requests_wait_in_fifo_past_the_inflight_limit_then_429() -> None:
    r = _router(engines=1, limit=1, queue=2)
    held = await r.acquire()
    waiting = [asyncio.ensure_future(r.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    assert r.queued == 2
    with pytest.raises(ServiceError) as info:
        r.admit()
    assert info.value.status == 429 and info.value.type == "overloaded"
    assert int(info.value.headers()["Retry-After"]) >= 1
    r.release(held)
    got = await waiting[0]
    assert got is held and r.queued == 1
    r.release(got)
    r.release(await waiting[1])
    assert r.in_flight == 0 and r.queued == 0
    r.admit()  # room again


async def test_a_replica_refuses_past_its_share_of_the_queue_naming_both_bounds() -> None:
    spec = _spec("q", 1, max_queued_requests=3)
    slot = EngineSlot(route_key="q", index=0, ref=EngineRef(), state="healthy")
    r = InstanceRouter(
        spec, [slot], inflight_limit=1, request_timeout_s=5.0, max_queued=2, engines_shared=True
    )
    held = await r.acquire()
    waiting = [asyncio.ensure_future(r.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(ServiceError) as info:
        r.admit()
    assert info.value.status == 429
    assert "max_queued_requests=3 (2 per ingress replica)" in info.value.message
    for w in waiting:
        w.cancel()
    r.release(held)


async def test_with_shared_engines_the_engines_not_a_flag_say_asleep() -> None:
    spec = _spec("q", 2)
    slots = [EngineSlot(route_key="q", index=i, ref=EngineRef(), state="healthy") for i in (0, 1)]
    r = InstanceRouter(spec, slots, inflight_limit=2, request_timeout_s=5.0, engines_shared=True)
    r.asleep = True  # put to sleep through this replica: the engines refuse, not the router
    r.admit()
    r.release(await r.acquire())
    r.engine_reports(slots[0], asleep=False)  # woken through another replica
    assert not r.asleep
    r.engine_reports(slots[0], asleep=True)
    assert not r.asleep  # one engine asleep is not the instance
    r.engine_reports(slots[1], asleep=True)
    assert r.asleep
    assert health_report({"q": r})[1]["instances"]["q"]["status"] == "asleep"


async def test_no_healthy_engine_is_503_at_once_and_fails_the_waiters() -> None:
    r = _router(engines=1, limit=1)
    held = await r.acquire()
    waiter = asyncio.ensure_future(r.acquire())
    await asyncio.sleep(0)
    r.set_state(r.slots[0], "dead", "gone")
    with pytest.raises(ServiceError) as info:
        await waiter
    assert info.value.status == 503 and "q/0: dead (gone)" in info.value.message
    with pytest.raises(ServiceError):
        r.admit()
    r.release(held)


def _recreatable_router() -> InstanceRouter:
    """One engine the service re-creates when it dies (its placement is known), serving."""
    r = _router(engines=1, limit=1)
    r.slots[0].ref = EngineRef(placement=object())  # type: ignore[arg-type]
    r.set_state(r.slots[0], "healthy")
    return r


async def test_a_request_waits_for_an_engine_being_recreated() -> None:
    r = _recreatable_router()
    r.set_state(r.slots[0], "dead", "actor died")
    r.admit()  # not refused: the engine comes back
    waiter = asyncio.ensure_future(r.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    r.set_state(r.slots[0], "starting", "loading the model")
    await asyncio.sleep(0.01)
    assert not waiter.done()
    r.set_state(r.slots[0], "healthy")
    assert (await asyncio.wait_for(waiter, 1)) is r.slots[0]


async def test_a_waiter_fails_when_the_recreated_engine_cannot_start() -> None:
    r = _recreatable_router()
    r.set_state(r.slots[0], "pending", "re-creating")
    waiter = asyncio.ensure_future(r.acquire())
    await asyncio.sleep(0.01)
    r.set_state(r.slots[0], "failed", "start failed again: no such model")
    with pytest.raises(ServiceError) as info:
        await waiter
    assert info.value.status == 503 and "no such model" in info.value.message
    status, body = health_report({"q": r})
    assert status == 503 and body["instances"]["q"]["engines_failed"] == 1


async def test_an_engine_that_never_served_is_not_waited_for() -> None:
    """Before its first start a request is refused at once (503, the client's retry), as a
    service still loading is."""
    r = _router(engines=1, limit=1)
    r.slots[0].ref = EngineRef(placement=object())  # type: ignore[arg-type]
    r.set_state(r.slots[0], "starting", "loading the model")
    with pytest.raises(ServiceError):
        r.admit()


async def test_retry_excludes_the_failed_engine() -> None:
    r = _router(limit=4)
    slot = await r.acquire(1, frozenset({"q/0"}))
    assert slot.engine_id == "q/1"
    r.set_state(r.slots[1], "unhealthy", "probe failed")
    with pytest.raises(ServiceError) as info:
        await r.acquire(1, frozenset({"q/0"}))
    assert info.value.status == 503


def test_asleep_instance_refuses_with_503() -> None:
    r = _router()
    r.asleep = True
    with pytest.raises(ServiceError) as info:
        r.admit()
    assert (info.value.status, info.value.type) == (503, "instance_asleep")


# ---- batches: what fails alone, what fails over ------------------------------------------------


class _Batches:
    """An engine actor's ``generate_many`` as the router calls it: one entry per request."""

    def __init__(self, answer: Callable[[EngineRequest], EngineOutput | BaseException]) -> None:
        self.answer = answer
        self.calls = 0
        self.sizes: list[int] = []  # the requests of each call
        self.generate_many = self
        self.generate = _One(self)

    def remote(self, requests: list[EngineRequest], **kwargs: object) -> Awaitable[list[object]]:
        assert kwargs == {"return_exceptions": True}  # the router's batches never raise whole
        self.calls += 1
        self.sizes.append(len(requests))

        async def run() -> list[object]:
            return [self.answer(r) for r in requests]

        return run()


class _One:
    """The same engine actor's ``generate``: one request (a retry of one sent alone)."""

    def __init__(self, batches: _Batches) -> None:
        self.batches = batches

    def remote(self, request: EngineRequest) -> Awaitable[object]:
        self.batches.calls += 1
        self.batches.sizes.append(1)

        async def run() -> object:
            out = self.batches.answer(request)
            if isinstance(out, BaseException):
                raise out
            return out

        return run()


def _text(r: EngineRequest) -> str:
    assert r.messages is not None
    return r.messages[0].content


def _answer(r: EngineRequest) -> EngineOutput | BaseException:
    if _text(r) == "too long":
        return PromptTooLongError(9000, 8192)
    if _text(r) == "verdict":
        return RequestRefusedError("sampling_params.logprob_verdict needs thinking off")
    return EngineOutput(_text(r).upper(), "stop", prompt_tokens=1, completion_tokens=1)


def _requests(*texts: str) -> list[EngineRequest]:
    sampling = SamplingParams(temperature=0.0)
    return [
        EngineRequest(sampling=sampling, messages=[Message(role="user", content=t)]) for t in texts
    ]


async def test_a_refused_request_of_a_batch_fails_alone_with_its_own_status() -> None:
    r = _router(limit=8)
    engines = [_Batches(_answer), _Batches(_answer)]
    for slot, engine in zip(r.slots, engines, strict=True):
        slot.handle = engine
    results = await r.generate_many(_requests("a", "verdict", "too long", "b"))
    first, verdict, long, last = results
    assert isinstance(first, tuple) and first[0].text == "A"
    assert isinstance(last, tuple) and last[0].text == "B"
    assert isinstance(verdict, ServiceError) and (verdict.status, verdict.type) == (
        422,
        "invalid_request",
    )
    assert "logprob_verdict" in verdict.message
    assert isinstance(long, ServiceError) and long.status == 413
    assert sum(e.calls for e in engines) == 1  # refused requests are not tried elsewhere


async def test_a_batch_the_engine_failed_as_a_whole_fails_over_to_another_engine() -> None:
    r = _router(limit=8)
    broken = _Batches(lambda req: EngineError("CUDA error: an illegal memory access"))
    working = _Batches(_answer)
    r.slots[0].handle, r.slots[1].handle = broken, working
    results = await r.generate_many(_requests("a", "b"))
    assert [res[0].text for res in results if isinstance(res, tuple)] == ["A", "B"]
    assert (broken.calls, working.calls) == (1, 1)


async def test_a_request_failed_beside_answered_neighbours_is_retried_on_another_engine() -> None:
    def flaky(req: EngineRequest) -> EngineOutput | BaseException:
        if _text(req) == "x":
            return EngineError("request aborted by the scheduler")
        return _answer(req)

    r = _router(limit=8)
    first, other = _Batches(flaky), _Batches(_answer)
    r.slots[0].handle, r.slots[1].handle = first, other
    results = await r.generate_many(_requests("a", "x", "verdict"))
    a, x, verdict = results
    assert isinstance(a, tuple) and a[0].text == "A" and a[1] is r.slots[0]
    assert isinstance(x, tuple) and x[0].text == "X" and x[1] is r.slots[1]
    assert isinstance(verdict, ServiceError) and verdict.status == 422  # refused: not retried
    assert (first.sizes, other.sizes) == ([3], [1])  # only the failed request went on

    # failed on both engines: 503, and the client must not send it a third time
    r = _router(limit=8)
    r.slots[0].handle, r.slots[1].handle = _Batches(flaky), _Batches(flaky)
    _, x = await r.generate_many(_requests("a", "x"))
    assert isinstance(x, ServiceError) and x.status == 503 and x.retryable is False
    assert "request aborted by the scheduler" in x.message
    # one engine only: 503 the client may retry
    r = _router(engines=1, limit=8)
    r.slots[0].handle = _Batches(flaky)
    _, x = await r.generate_many(_requests("a", "x"))
    assert isinstance(x, ServiceError) and x.status == 503 and x.retryable is not False
    assert "no other healthy engine" in x.message


# ---- single requests of one turn: one engine call ------------------------------------------


async def test_concurrent_single_requests_go_to_the_engine_as_one_call() -> None:
    """A burst of single requests (a client's concurrent /generate) costs the engine actor one
    call, and each request keeps its own answer or its own error; a lone request goes alone."""
    r = _router(engines=1, limit=64, queue=64)
    engine = _Batches(_answer)
    r.slots[0].handle = engine
    texts = ["a", "b", "too long", "c", "verdict"]
    results = await asyncio.gather(
        *(r.generate(req) for req in _requests(*texts)), return_exceptions=True
    )
    assert engine.sizes == [5]
    a, b, long, c, verdict = results
    assert [x[0].text for x in (a, b, c) if isinstance(x, tuple)] == ["A", "B", "C"]
    assert isinstance(long, ServiceError) and long.status == 413
    assert isinstance(verdict, ServiceError) and verdict.status == 422
    out, slot = await r.generate(_requests("d")[0])
    assert out.text == "D" and slot is r.slots[0] and engine.sizes == [5, 1]
    assert r.in_flight == 0
    # never more per call than one engine batch holds
    spec = _spec("q", 1, max_queued_requests=64, max_batch_size=2)
    slot = EngineSlot(route_key="q", index=0, ref=EngineRef(), state="healthy")
    r = InstanceRouter(spec, [slot], inflight_limit=64, request_timeout_s=5.0)
    engine = _Batches(_answer)
    slot.handle = engine
    await asyncio.gather(*(r.generate(req) for req in _requests("e", "f", "g", "h", "i")))
    assert engine.sizes == [2, 2, 1]
    assert r.in_flight == 0


async def test_concurrent_single_requests_of_a_failed_engine_are_each_retried_elsewhere() -> None:
    r = _router(engines=2, limit=64, queue=64)
    broken = _Batches(lambda req: EngineError("CUDA error: an illegal memory access"))
    working = _Batches(_answer)
    r.slots[0].handle, r.slots[1].handle = broken, working
    results = await asyncio.gather(*(r.generate(req) for req in _requests("a", "b", "c", "d")))
    assert [out.text for out, _ in results] == ["A", "B", "C", "D"]
    assert all(slot is r.slots[1] for _, slot in results)
    assert broken.sizes == [2]  # the two of the four the least-loaded choice gave it
    assert sorted(working.sizes) == [1, 1, 2]  # its own two together; the failed ones one by one
    assert r.in_flight == 0


class _Hanging:
    """An engine actor whose ``generate_many`` runs until cancelled, noting that it was."""

    def __init__(self) -> None:
        self.cancelled = 0
        self.generate_many = self

    def remote(self, requests: list[EngineRequest], **kwargs: object) -> Awaitable[list[object]]:
        async def run() -> list[object]:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return []

        return run()


async def test_a_shared_call_is_cancelled_only_when_all_its_callers_went_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    cancelled_refs: list[object] = []  # what the router asked Ray to cancel on the engine actor
    monkeypatch.setattr(ray, "cancel", cancelled_refs.append)
    r = _router(engines=1, limit=64, queue=64)
    engine = _Hanging()
    r.slots[0].handle = engine
    a, b = (asyncio.ensure_future(r.generate(req)) for req in _requests("a", "b"))
    await asyncio.sleep(0.05)
    a.cancel()
    await asyncio.sleep(0.05)
    assert engine.cancelled == 0 and not b.done() and not cancelled_refs  # b still waits
    b.cancel()
    await asyncio.sleep(0.05)
    assert engine.cancelled == 1 and len(cancelled_refs) == 1  # the engine's work is called off
    assert r.in_flight == 0


# ---- one deadline per request ----------------------------------------------------------------


class _Gated:
    """An engine actor's ``generate_many`` that answers "first" once ``gate`` opens and holds
    every other request until cancelled; it notes the time left each request carried."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.carried: list[float | None] = []
        self.generate_many = self

    def remote(self, requests: list[EngineRequest], **kwargs: object) -> Awaitable[list[object]]:
        self.carried.extend(r.timeout_s for r in requests)

        async def run() -> list[object]:
            if all(_text(r) == "first" for r in requests):
                await self.gate.wait()
                return [_answer(r) for r in requests]
            await asyncio.sleep(30)
            return []

        return run()


async def test_a_request_has_one_deadline_across_the_slot_wait_and_the_engine_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Queued behind a held engine slot for most of its deadline, a request then gets the slot
    and an engine that does not answer: it fails at its deadline with the timeout status, not
    after a fresh deadline for the engine call; the engine actor's queue gets what is left."""
    import ray

    monkeypatch.setattr(ray, "cancel", lambda ref: None)
    r = _router(engines=1, limit=1, queue=4)
    r.request_timeout_s = 1.0
    gate = asyncio.Event()
    engine = _Gated(gate)
    r.slots[0].handle = engine
    first_request, held_request = _requests("first", "held")
    first = asyncio.ensure_future(r.generate(first_request))
    await asyncio.sleep(0.01)
    start = time.monotonic()
    held = asyncio.ensure_future(r.generate(held_request))
    await asyncio.sleep(0.7)
    assert not held.done() and r.queued == 1  # waiting for the slot
    gate.set()  # the slot frees with about 0.3 s left of the held request's deadline
    out, _ = await first
    assert out.text == "FIRST"
    with pytest.raises(ServiceError) as caught:
        await held
    elapsed = time.monotonic() - start
    assert caught.value.type == "timeout" and caught.value.status == 504
    assert 0.9 < elapsed < 1.4  # at its deadline; a fresh 1.0 s for the call would be 1.7
    left = engine.carried[-1]
    assert left is not None and left < 0.4  # the time left, not a fresh request_timeout_s
    assert r.in_flight == 0 and r.queued == 0


async def test_a_request_past_its_deadline_is_not_sent_to_an_engine() -> None:
    r = _router(engines=1, limit=8)
    engine = _Batches(_answer)
    r.slots[0].handle = engine
    r.request_timeout_s = 0.0
    with pytest.raises(ServiceError) as caught:
        await r.generate(_requests("a")[0])
    assert caught.value.type == "timeout" and engine.calls == 0
    (entry,) = await r.generate_many(_requests("b"))
    assert isinstance(entry, ServiceError) and entry.type == "timeout" and engine.calls == 0
    assert r.in_flight == 0
