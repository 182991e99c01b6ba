"""The worker's queue and its batching policy: whole call units into batches of at most
``max_batch_size`` requests, waiting ``batch_wait_s`` for each next unit and at most
``batch_wait_max_s`` from the first.

A judge request is prefill-bound (a long prompt, one or two output tokens), so an engine that
computes one batch at a time (hf) gets its throughput from putting concurrent requests into one
forward pass: this is what collects them. An engine that schedules requests itself (SGLang,
``Engine.continuous_batching``) gets each batch as it forms. The :class:`EngineWorker` in front
of either knows nothing of the policy: it puts each call's requests in as one unit and takes
batches out.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

__all__ = ["MicroBatcher"]

T = TypeVar("T")


class MicroBatcher(Generic[T]):
    """Units (lists of items that must share a batch) in, batches of whole units out.

    A unit larger than ``max_batch_size`` goes alone (the engine splits it). Every unit taken
    out (``next_batch``, ``drain``) is marked done with ``task_done`` once handled, so ``join``
    waits for what is queued and in hand.
    """

    def __init__(self, max_batch_size: int, batch_wait_s: float, batch_wait_max_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.batch_wait_max_s = batch_wait_max_s
        self._queue: asyncio.Queue[list[T]] = asyncio.Queue()
        #: a unit taken from the queue that did not fit into the last batch: the next one's first
        self._carry: list[T] | None = None
        #: items queued and not yet in a batch
        self.queued = 0

    def put(self, unit: list[T]) -> None:
        self.queued += len(unit)
        self._queue.put_nowait(unit)

    def task_done(self) -> None:
        self._queue.task_done()

    async def join(self) -> None:
        await self._queue.join()

    def drain(self) -> list[list[T]]:
        """Every unit not yet in a batch, taken out (each to be marked done)."""
        units: list[list[T]] = []
        if self._carry is not None:
            units.append(self._carry)
            self._carry = None
        while not self._queue.empty():
            units.append(self._queue.get_nowait())
        for unit in units:
            self.queued -= len(unit)
        return units

    async def next_batch(self) -> list[list[T]]:
        """Whole units, up to ``max_batch_size`` items, waiting ``batch_wait_s`` for each next
        one, at most ``batch_wait_max_s`` from the first."""
        if self._carry is not None:
            first, self._carry = self._carry, None
        else:
            first = await self._queue.get()
        batch = [first]
        size = len(first)
        limit = self.max_batch_size
        loop = asyncio.get_running_loop()
        latest = loop.time()  # the latest arrival: each one restarts the wait
        cap = latest + self.batch_wait_max_s
        while size < limit:
            try:
                unit = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = min(cap, latest + self.batch_wait_s) - loop.time()
                if remaining <= 0:
                    break
                try:
                    unit = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            if size + len(unit) > limit:
                self._carry = unit  # whole units only: it opens the next batch
                break
            batch.append(unit)
            size += len(unit)
            latest = loop.time()
        self.queued -= size
        return batch
