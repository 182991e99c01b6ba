"""One instance's engines: admission, one deadline per request, one retry on another engine.

An instance (route_key) is served by a list of engine slots. Each request takes the engine the
policy chooses (``policy``: the healthy engine with the fewest requests in flight, or its prefix
key's home); an engine holds at most ``inflight_limit`` requests at once (its batcher needs the
next batch ready, not the whole queue), the rest wait here in FIFO order, and past
``max_queued_requests`` waiting the instance answers 429. An engine that fails a request is left
out and the request tried once more on another engine; after that, 503 marked
``x-should-retry: false`` (the client does not send it a third time). With no other engine to
try, the 503 carries ``Retry-After`` instead: waiting for the supervisor to revive an engine is
the client's retry. The router never probes: the supervisor owns health; the router only
reports actor deaths it sees.

A request has one deadline, ``request_timeout_s`` from its arrival here: the wait for an engine
slot, the engine call, a retry on another engine and the engine actor's own queue wait (the time
left travels with the request, ``EngineRequest.timeout_s``) each take what is left of it, never
a fresh ``request_timeout_s`` of their own. Past it the request fails with the ``timeout`` error
type (its status comes from the one table, ``genrm_client.types.ERROR_TYPE_STATUS``).

How requests are grouped into engine calls lives beside this module: single requests of one
turn of the event loop go out together (``coalescing``; a retry goes alone), and a batch is cut
into chunks that keep each prefix key's requests together (``chunking``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    EngineAsleepError,
    EngineOutput,
    EngineRequest,
    EngineTimeoutError,
    PromptTooLongError,
    RequestRefusedError,
)
from genrm_serve.engines.remote import EngineGoneError
from genrm_serve.errors import ServiceError
from genrm_serve.router.chunking import chunk_by_key
from genrm_serve.router.coalescing import Coalescer
from genrm_serve.router.policy import Choice, affinity_slack, choose_engine
from genrm_serve.router.slot import EngineSlot, SlotState

__all__ = ["InstanceRouter", "error_message"]

#: The name its log lines have always carried (``%(name)s``), not this module's.
logger = logging.getLogger("genrm_serve.router")

#: What the router asks of an engine: one request, or a batch (each entry its own answer).
_Method = Literal["generate", "generate_many"]


def error_message(err: BaseException) -> str:
    """The message of the engine's own exception, without Ray's remote traceback."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and cause is not err:
        err = cause
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


#: A request's own failures, not its engine's: refused (its own status), or out of time in the
#: engine's queue (the timeout status). Never retried on another engine.
_OWN_FAILURES = (RequestRefusedError, EngineTimeoutError)


def _engine_failed(results: list[Any]) -> bool:
    """Every request of a batch failed and none was refused for its own sake: the engine failed
    (another engine may serve them), not the requests."""
    return bool(results) and all(
        isinstance(r, BaseException) and not isinstance(r, _OWN_FAILURES) for r in results
    )


def _failed_alone(entry: Any) -> bool:
    """An entry of a batch that failed for no reason of its own (an engine error)."""
    return isinstance(entry, BaseException) and not isinstance(
        entry, (*_OWN_FAILURES, ServiceError)
    )


@dataclass
class _Waiter:
    n: int
    exclude: frozenset[str]
    future: asyncio.Future[EngineSlot]
    key: str | None = None


class _EngineFailure(Exception):
    """An engine could not serve a request; another engine may."""

    def __init__(self, slot: EngineSlot, err: BaseException) -> None:
        super().__init__(f"engine {slot.engine_id} failed: {error_message(err)}")
        self.slot = slot
        self.asleep = isinstance(err, EngineAsleepError)


#: One request's answer from a batch: its output and the engine that gave it, or its own error.
_Entry = tuple[EngineOutput, EngineSlot] | ServiceError


class InstanceRouter:
    """Routes one instance's requests onto its engine slots."""

    def __init__(
        self,
        spec: InstanceSpec,
        slots: Sequence[EngineSlot],
        *,
        inflight_limit: int,
        request_timeout_s: float,
        on_engine_gone: Callable[[EngineSlot], None] | None = None,
        max_queued: int | None = None,
        engines_shared: bool = False,
    ) -> None:
        """``max_queued``: this router's queue bound (None: the instance's
        ``max_queued_requests``). ``engines_shared``: other ingress replicas route onto the same
        engines, so a sleep is known from the engines (they refuse while asleep; the probes
        report it), not from a flag of this replica's."""
        self.spec = spec
        self.route_key = spec.route_key
        self.slots = list(slots)
        self.inflight_limit = inflight_limit
        self.max_queued = (
            spec.engine_config.max_queued_requests if max_queued is None else max_queued
        )
        self.engines_shared = engines_shared
        self.max_batch = spec.engine_config.max_batch_size
        self.request_timeout_s = request_timeout_s
        self.asleep = False
        self._on_engine_gone = on_engine_gone
        self._waiters: deque[_Waiter] = deque()
        self._rr = 0
        self._avg_latency_s = 0.5
        self._idle = asyncio.Event()
        self._idle.set()
        #: the single requests of one turn of the event loop, sent as one call per engine
        self._coalescer = Coalescer(self._call_many, self.max_batch)
        #: Requests with a prefix key routed to the key's home engine / spilled to the least
        #: loaded one (bounded load), for metrics.
        self.affinity_slack = affinity_slack(inflight_limit)
        self.affinity_home = 0
        self.affinity_spilled = 0

    # ---- state, for health and metrics ---------------------------------------------------

    @property
    def queued(self) -> int:
        return sum(w.n for w in self._waiters if not w.future.done())

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.slots)

    @property
    def engines_healthy(self) -> int:
        return sum(1 for s in self.slots if s.healthy)

    # ---- health transitions (called by the supervisor, and on actor death) -------------

    def set_state(self, slot: EngineSlot, state: SlotState, detail: str | None = None) -> None:
        if slot.state != state:
            logger.info("engine %s: %s -> %s (%s)", slot.engine_id, slot.state, state, detail)
        slot.state = state
        slot.detail = detail
        slot.served = slot.served or state == "healthy"
        self._dispatch()

    def engine_reports(self, slot: EngineSlot, *, asleep: bool) -> None:
        """A health probe's answer. With shared engines the instance is asleep when every
        healthy engine is: another replica may have put it to sleep or woken it."""
        slot.asleep = asleep
        if self.engines_shared:
            healthy = [s for s in self.slots if s.healthy]
            self.asleep = bool(healthy) and all(s.asleep for s in healthy)

    @property
    def _refusing(self) -> bool:
        """Asleep by this router's own word: refuse at admission instead of at the engine."""
        return self.asleep and not self.engines_shared

    def engine_gone(self, slot: EngineSlot, err: BaseException) -> None:
        """A call found the actor dead: stop routing to it now, let the supervisor revive it."""
        if slot.state in ("healthy", "unhealthy", "starting"):
            self.set_state(slot, "dead", f"actor died: {error_message(err)}")
            if self._on_engine_gone is not None:
                self._on_engine_gone(slot)

    # ---- admission and choice ------------------------------------------------------------

    def _retry_after(self) -> float:
        engines = max(1, self.engines_healthy)
        return max(1.0, self._avg_latency_s * self.queued / (engines * self.inflight_limit))

    def _no_engine_error(self, exclude: frozenset[str] = frozenset()) -> ServiceError:
        down = [
            f"{s.engine_id}: {s.state}" + (f" ({s.detail})" if s.detail else "")
            for s in self.slots
            if not s.healthy or s.engine_id in exclude
        ]
        return ServiceError.unavailable(
            self.route_key, "no healthy engine to serve the request [" + "; ".join(down) + "]"
        )

    def admit(self, n: int = 1) -> None:
        """Refuse now (429 / 503) what the instance cannot take; never waits."""
        if self._refusing:
            raise ServiceError.asleep(self.route_key)
        if not any(s.healthy or s.reviving for s in self.slots):
            raise self._no_engine_error()
        queued = self.queued
        would_wait = bool(self._waiters) or self._pick(n, frozenset()) is None
        if would_wait and queued > 0 and queued + n > self.max_queued:
            raise ServiceError.overloaded(
                self.route_key,
                queued,
                self.spec.engine_config.max_queued_requests,
                self._retry_after(),
                share=self.max_queued,
            )

    def _pick(
        self, n: int, exclude: frozenset[str], key: str | None = None
    ) -> Choice[EngineSlot] | None:
        """Where ``n`` requests go now (``policy.choose_engine``), None while none has room."""
        return choose_engine(
            self.slots,
            n,
            key,
            inflight_limit=self.inflight_limit,
            slack=self.affinity_slack,
            exclude=exclude,
            start=self._rr,
        )

    def _take(self, choice: Choice[EngineSlot], n: int) -> EngineSlot:
        slot = choice.engine
        if choice.home is not None:
            if choice.home:
                self.affinity_home += n
            else:
                self.affinity_spilled += n
        slot.in_flight += n
        self._idle.clear()
        # Ties go round-robin: the next search starts after the engine just chosen.
        self._rr = (self.slots.index(slot) + 1) % len(self.slots)
        return slot

    def _dispatch(self) -> None:
        while self._waiters:
            waiter = self._waiters[0]
            if waiter.future.done():
                self._waiters.popleft()
                continue
            if self._refusing:
                self._waiters.popleft()
                waiter.future.set_exception(ServiceError.asleep(self.route_key))
                continue
            if not self._can_serve(waiter.exclude):
                self._waiters.popleft()
                waiter.future.set_exception(self._no_engine_error(waiter.exclude))
                continue
            choice = self._pick(waiter.n, waiter.exclude, waiter.key)
            if choice is None:
                return
            self._waiters.popleft()
            waiter.future.set_result(self._take(choice, waiter.n))

    def _can_serve(self, exclude: frozenset[str]) -> bool:
        """Some engine serves now, or will once re-created: a request waits for it (within its
        deadline) rather than fail, so an engine restart is a delay and not a judge error."""
        return any((s.healthy and s.engine_id not in exclude) or s.reviving for s in self.slots)

    def deadline(self) -> float:
        """The deadline (``time.monotonic()``) of a request arriving now."""
        return time.monotonic() + self.request_timeout_s

    def _timeout(self, what: str) -> ServiceError:
        return ServiceError(
            "timeout",
            f"route_key={self.route_key}: {what} (the request's deadline: "
            f"request_timeout_s={self.request_timeout_s})",
            route_key=self.route_key,
        )

    def _left(self, deadline: float, what: str) -> float:
        """The seconds left before ``deadline``; past it, the timeout error (``what`` did not
        happen in time)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._timeout(what)
        return left

    async def acquire(
        self,
        n: int = 1,
        exclude: frozenset[str] = frozenset(),
        key: str | None = None,
        deadline: float | None = None,
    ) -> EngineSlot:
        """Reserve ``n`` request slots on the least-loaded healthy engine (or ``key``'s home,
        see ``policy.choose_engine``), waiting in line until ``deadline`` (default: a request
        arriving now)."""
        if self._refusing:
            raise ServiceError.asleep(self.route_key)
        if not self._waiters:
            choice = self._pick(n, exclude, key)
            if choice is not None:
                return self._take(choice, n)
        if not self._can_serve(exclude):
            raise self._no_engine_error(exclude)
        what = "no engine slot freed up in time"
        left = self._left(self.deadline() if deadline is None else deadline, what)
        future: asyncio.Future[EngineSlot] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(n, exclude, future, key)
        self._waiters.append(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(future), left)
        except BaseException as err:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result(), n)
            else:
                future.cancel()
            if isinstance(err, TimeoutError):
                raise self._timeout(what) from err
            raise

    def release(self, slot: EngineSlot, n: int = 1) -> None:
        slot.in_flight = max(0, slot.in_flight - n)
        self._dispatch()
        if self.in_flight == 0:
            self._idle.set()

    # ---- calls -----------------------------------------------------------------------------

    async def _call(
        self, slot: EngineSlot, method: _Method, payload: Any, deadlines: Sequence[float]
    ) -> Any:
        """``generate`` (one request) or ``generate_many`` (a batch, each entry its output or
        its own error) on ``slot``'s engine, within the requests' ``deadlines`` (one each, in
        order): the call lasts until the latest, and each request carries its own time left to
        the engine actor's queue. The actor cancels the call on the engine when its caller goes
        away (free the engine's slot for someone else) or runs out of time."""
        start = time.monotonic()
        what = f"engine {slot.engine_id} did not answer in time"
        requests = [payload] if method == "generate" else payload
        for request, deadline in zip(requests, deadlines, strict=True):
            request.timeout_s = max(0.0, deadline - start)
        timeout_s = self._left(max(deadlines), what)
        try:
            if method == "generate":
                result: Any = await slot.actor.generate(payload, timeout_s=timeout_s)
            else:
                result = await slot.actor.generate_many(
                    payload, return_exceptions=True, timeout_s=timeout_s
                )
                if _engine_failed(result):
                    raise result[0]  # every request failed, none for its own sake: the engine did
        except (RequestRefusedError, EngineTimeoutError) as err:
            raise self._item_error(err) from err
        except TimeoutError as err:
            raise self._timeout(what) from err
        except EngineGoneError as err:
            self.engine_gone(slot, err)
            raise _EngineFailure(slot, err) from err
        except EngineAsleepError as err:
            raise _EngineFailure(slot, err) from err
        except Exception as err:
            logger.warning("engine %s failed a request: %s", slot.engine_id, error_message(err))
            raise _EngineFailure(slot, err) from err
        self._avg_latency_s = 0.9 * self._avg_latency_s + 0.1 * (time.monotonic() - start)
        return result

    async def _with_retry(
        self,
        n: int,
        method: _Method,
        payload: Any,
        *,
        deadline: float,
        send: Callable[[EngineSlot], Awaitable[Any]] | None = None,
        key: str | None = None,
    ) -> tuple[Any, EngineSlot]:
        """``method(payload)`` on the least-loaded engine (or ``key``'s home; through ``send``
        when given), and once on another engine if that one failed, all before ``deadline``."""
        slot = await self.acquire(n, key=key, deadline=deadline)
        try:
            call = send(slot) if send else self._call(slot, method, payload, [deadline] * n)
            return await call, slot
        except _EngineFailure as first:
            failure = first
        finally:
            self.release(slot, n)
        return await self._elsewhere(failure, n, method, payload, deadline)

    async def _elsewhere(
        self, failure: _EngineFailure, n: int, method: _Method, payload: Any, deadline: float
    ) -> tuple[Any, EngineSlot]:
        """The one retry: on another engine than the one that failed — or on the same one once
        it is re-created (a new actor), when it died — within what is left of ``deadline``."""
        failed = failure.slot
        exclude = frozenset() if failed.reviving else frozenset({failed.engine_id})
        try:
            retry = await self.acquire(n, exclude, deadline=deadline)
        except ServiceError as err:
            if err.type == "timeout":
                raise
            if failure.asleep:  # engines put to sleep directly on their actors (rl-core)
                raise ServiceError.asleep(self.route_key) from err
            raise ServiceError.unavailable(
                self.route_key, f"{failure}; no other healthy engine to retry on"
            ) from err
        try:  # alone, not coalesced: a retry is rare, and its call is its own
            return await self._call(retry, method, payload, [deadline] * n), retry
        except _EngineFailure as second:
            if failure.asleep and second.asleep:
                raise ServiceError.asleep(self.route_key) from second
            # It ran on two engines: the client must not send it again (one retry owner).
            raise ServiceError.unavailable(
                self.route_key, f"{failure}; the retry failed too: {second}", retryable=False
            ) from second
        finally:
            self.release(retry, n)

    async def generate(self, request: EngineRequest) -> tuple[EngineOutput, EngineSlot]:
        """One request: least-loaded engine, one retry elsewhere on an engine failure."""
        self.admit(1)
        deadline = self.deadline()
        send = functools.partial(self._coalesced, request=request, deadline=deadline)
        out, slot = await self._with_retry(
            1, "generate", request, deadline=deadline, send=send, key=request.prefix_key
        )
        return out, slot

    async def _coalesced(
        self, slot: EngineSlot, request: EngineRequest, deadline: float
    ) -> EngineOutput:
        """``request``'s answer from ``slot``, in one call with the other single requests given
        to that engine in this turn of the event loop (``coalescing``); the caller waits until
        its own deadline, the shared call until the latest of its requests'."""
        what = f"engine {slot.engine_id} did not answer in time"
        left = self._left(deadline, what)
        future = self._coalescer.submit(slot, request, deadline)
        try:
            return await asyncio.wait_for(future, left)
        except TimeoutError as err:  # the future is cancelled: the shared call goes on without it
            raise self._timeout(what) from err

    async def _call_many(
        self, slot: EngineSlot, requests: list[EngineRequest], deadlines: list[float]
    ) -> list[EngineOutput | BaseException]:
        """The coalesced requests' engine call: per request, its output or its caller's error."""
        outs = await self._call(slot, "generate_many", requests, deadlines)
        return [self._single_answer(slot, out) for out in outs]

    def _single_answer(
        self, slot: EngineSlot, out: EngineOutput | BaseException
    ) -> EngineOutput | BaseException:
        if not isinstance(out, BaseException):
            return out
        if _failed_alone(out):  # beside answered neighbours: retried elsewhere, as alone
            return _EngineFailure(slot, out)
        return self._item_error(out)  # refused for its own sake: its own status, not retried

    async def generate_many(self, requests: list[EngineRequest]) -> list[_Entry]:
        """Many requests, in chunks of ``max_batch_size`` spread over the engines, in order.

        A request the engine refuses (an over-long prompt, a value it cannot honour) gets its
        own error; its neighbours are answered. A request that failed beside answered neighbours
        (the engine lives) is tried once more on another engine, as a lone request would be.
        Requests with a ``prefix_key`` are chunked by key (``chunking.chunk_by_key``).
        """
        chunks = chunk_by_key([r.prefix_key for r in requests], self.slots, self.max_batch)
        deadline = self.deadline()

        async def run_chunk(
            chunk: list[EngineRequest],
        ) -> list[tuple[EngineOutput, EngineSlot] | ServiceError]:
            try:
                outs, slot = await self._with_retry(
                    len(chunk), "generate_many", chunk, deadline=deadline, key=chunk[0].prefix_key
                )
            except ServiceError as err:
                return [err] * len(chunk)
            results = self._entries(outs, slot, retried=False)
            failed = [i for i, out in enumerate(outs) if _failed_alone(out)]
            if failed:
                retry = [chunk[i] for i in failed]
                again = await self._retry_items(retry, slot, outs[failed[0]], deadline)
                for i, result in zip(failed, again, strict=True):
                    results[i] = result
            return results

        parts = await asyncio.gather(*(run_chunk([requests[i] for i in c]) for c in chunks))
        answers: dict[int, _Entry] = {}
        for chunk, part in zip(chunks, parts, strict=True):
            answers.update(zip(chunk, part, strict=True))
        return [answers[i] for i in range(len(requests))]

    async def _retry_items(
        self,
        requests: list[EngineRequest],
        tried: EngineSlot,
        first: BaseException,
        deadline: float,
    ) -> list[tuple[EngineOutput, EngineSlot] | ServiceError]:
        try:
            outs, slot = await self._elsewhere(
                _EngineFailure(tried, first),
                len(requests),
                "generate_many",
                requests,
                deadline,
            )
        except ServiceError as err:
            return [err] * len(requests)
        return self._entries(outs, slot, retried=True)

    def _entries(
        self, outs: list[Any], slot: EngineSlot, *, retried: bool
    ) -> list[tuple[EngineOutput, EngineSlot] | ServiceError]:
        """The engine's per-request entries as answers or errors (a request that has run on
        two engines must not be sent again by the client: one retry owner)."""
        results: list[tuple[EngineOutput, EngineSlot] | ServiceError] = []
        for out in outs:
            if not isinstance(out, BaseException):
                results.append((out, slot))
            elif retried and _failed_alone(out):
                message = f"{error_message(out)} (on its second engine, {slot.engine_id})"
                results.append(ServiceError.unavailable(self.route_key, message, retryable=False))
            else:
                results.append(self._item_error(out))
        return results

    def _item_error(self, err: BaseException) -> ServiceError:
        if isinstance(err, ServiceError):
            return err
        if isinstance(err, EngineTimeoutError):
            return self._timeout(error_message(err))
        if isinstance(err, RequestRefusedError):
            type_ = "prompt_too_long" if isinstance(err, PromptTooLongError) else "invalid_request"
            return ServiceError(type_, error_message(err), route_key=self.route_key)
        return ServiceError.unavailable(self.route_key, error_message(err))

    # ---- sleep / wake ----------------------------------------------------------------------

    async def sleep(self, timeout_s: float) -> None:
        """Stop admitting, let in-flight requests finish, then free every engine's memory."""
        self.asleep = True
        self._dispatch()
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        await self._on_engines("sleep", max(1.0, deadline - time.monotonic()))

    async def wake(self, timeout_s: float) -> None:
        """Restore every engine's memory, then admit requests again."""
        await self._on_engines("wake", timeout_s)
        self.asleep = False
        self._dispatch()

    async def _on_engines(self, method: Literal["sleep", "wake"], timeout_s: float) -> None:
        slots = [s for s in self.slots if s.handle is not None and s.state == "healthy"]

        async def one(slot: EngineSlot) -> str | None:
            try:
                if method == "sleep":
                    await slot.actor.sleep(timeout_s=timeout_s)
                else:
                    await slot.actor.wake(timeout_s=timeout_s)
            except Exception as err:
                if isinstance(err, EngineGoneError):
                    self.engine_gone(slot, err)
                return f"{slot.engine_id}: {error_message(err)}"
            return None

        errors = [e for e in await asyncio.gather(*(one(s) for s in slots)) if e]
        if errors:
            raise ServiceError(
                f"{method}_failed",
                f"route_key={self.route_key}: {method} failed on " + "; ".join(errors),
                route_key=self.route_key,
            )
