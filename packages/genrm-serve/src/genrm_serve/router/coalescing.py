"""Single requests given to one engine in one turn of the event loop go out as one call.

A Ray actor call costs about a millisecond of CPU in the ingress and again in the engine actor:
a burst of single requests (a client's concurrent ``/generate``) pays it once per engine, and
reaches the engine's batcher as one unit. A lone request goes alone, with no wait added. Each
request keeps its own slot, admission, deadline and retry (the router's), as if it had been sent
alone: this module only gathers, sends, and hands each caller its own entry of the answer. A
shared call lasts until the latest deadline of its requests and is cancelled only when every
one of its callers went away.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from genrm_serve.engines.base import EngineOutput, EngineRequest
from genrm_serve.router.slot import EngineSlot

__all__ = ["Coalescer", "SendMany"]

#: One engine call for requests given to ``slot`` (each with its deadline): per request, its
#: output or the exception its caller gets; raising fails every request of the call.
SendMany = Callable[
    [EngineSlot, list[EngineRequest], list[float]], Awaitable[list[EngineOutput | BaseException]]
]

#: A single request waiting for this turn's call: the request, its caller's future, and its
#: deadline (``time.monotonic()``).
_Single = tuple[EngineRequest, "asyncio.Future[EngineOutput]", float]


def _cancel_if_abandoned(task: asyncio.Task[None], futures: list[Any], _done: object) -> None:
    """Every caller of a shared engine call went away: cancel the call, which cancels the
    engine's work, as a request sent alone would."""
    if all(future.cancelled() for future in futures):
        task.cancel()


class Coalescer:
    """Gathers the single requests of one turn of the event loop per engine."""

    def __init__(self, send: SendMany, max_batch: int) -> None:
        """``send``: the engine call (the router's, with its deadlines and error mapping);
        ``max_batch``: the most requests one call carries (one engine batch)."""
        self.max_batch = max_batch
        self._send = send
        #: per engine, the single requests of this turn of the event loop
        self._pending: dict[str, list[_Single]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def submit(
        self, slot: EngineSlot, request: EngineRequest, deadline: float
    ) -> asyncio.Future[EngineOutput]:
        """``request``'s answer from ``slot``, sent with the others submitted to that engine in
        this turn of the event loop; cancelling the future drops this caller from the call."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[EngineOutput] = loop.create_future()
        pending = self._pending.setdefault(slot.engine_id, [])
        pending.append((request, future, deadline))
        if len(pending) == 1:
            loop.call_soon(self._flush, slot)
        return future

    def _flush(self, slot: EngineSlot) -> None:
        singles = self._pending.pop(slot.engine_id, [])
        for i in range(0, len(singles), self.max_batch):  # one engine batch each at most
            chunk = singles[i : i + self.max_batch]
            task = asyncio.ensure_future(self._answer(slot, chunk))
            self._sending.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._sending.discard)
            futures = [future for _, future, _ in chunk]
            for future in futures:
                future.add_done_callback(functools.partial(_cancel_if_abandoned, task, futures))

    async def _answer(self, slot: EngineSlot, singles: list[_Single]) -> None:
        requests = [request for request, _, _ in singles]
        deadlines = [deadline for _, _, deadline in singles]
        try:
            outs = await self._send(slot, requests, deadlines)
        except asyncio.CancelledError:  # every caller went away, or the ingress stops
            for _, future, _ in singles:
                future.cancel()
            raise
        except Exception as err:  # the whole call failed: each of its requests fails so
            for _, future, _ in singles:
                if not future.done():
                    future.set_exception(err)
            return
        for (_, future, _), out in zip(singles, outs, strict=True):
            if future.done():  # a caller that went away
                continue
            if isinstance(out, BaseException):
                future.set_exception(out)
            else:
                future.set_result(out)
