"""Waits on Ray that say what they wait for: a line every few seconds, and a deadline.

A start-up that hangs (a placement group, an actor that is never scheduled, the judge service's
deploy) must never look like a run that works: every such wait in rl-core goes through
:func:`wait_saying` or a :class:`Heartbeat` (``limits.WAIT_WORD_EVERY_S``), with its deadline
from ``rl_core.limits``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TypeVar

from rl_core.limits import WAIT_WORD_EVERY_S

__all__ = ["Heartbeat", "wait_saying"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Heartbeat:
    """``beat(elapsed_s, detail)`` after every poll of a wait; logs at most every ``every_s``."""

    def __init__(self, what: str, timeout_s: float, every_s: float = WAIT_WORD_EVERY_S) -> None:
        self.what, self.timeout_s, self.every_s = what, timeout_s, every_s
        self._next = every_s

    def __call__(self, elapsed_s: float, detail: object = "") -> None:
        if elapsed_s < self._next:
            return
        self._next = elapsed_s + self.every_s
        said = f": {detail}" if detail not in ("", None) else ""
        logger.info("waiting %.0f s (of %.0f) for %s%s", elapsed_s, self.timeout_s, self.what, said)


async def wait_saying(
    aw: Awaitable[T], what: str, timeout_s: float, every_s: float = WAIT_WORD_EVERY_S
) -> T:
    """``aw`` within ``timeout_s`` (``TimeoutError`` naming ``what`` past it), with a line every
    ``every_s`` while it runs."""
    task = asyncio.ensure_future(aw)
    beat = Heartbeat(what, timeout_s, every_s)
    start = time.monotonic()
    try:
        while True:
            elapsed = time.monotonic() - start
            left = timeout_s - elapsed
            if left <= 0:
                raise TimeoutError(f"{what}: not done within {timeout_s:.0f} s")
            done, _ = await asyncio.wait({task}, timeout=min(every_s, left))
            if done:
                return task.result()
            beat(time.monotonic() - start)
    finally:
        if not task.done():
            task.cancel()
