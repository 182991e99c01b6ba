"""A verdict cache so the n samples of a GRPO group that give the same answer cost one judge call.

Keys are a digest of (judge signature, question, label, normalised answer): the signature holds
the route_key, the prompt template's version and the request sampling overrides, so a changed
prompt or judge never reuses an old verdict. Only real verdicts (``ok`` / ``unparsed``) are
stored; a failed call is never cached, so the next sample retries the judge. Concurrent requests
for the same key share one in-flight call (the second awaits the first) instead of racing to
the judge. In-flight entries belong to the event loop that started them; another loop (a new
test, a restarted trainer) does not wait on them. Entries are evicted least-recently-used.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["VerdictCache", "cache_key", "normalise_answer", "wait_shared"]

T = TypeVar("T")

_WS = re.compile(r"\s+")


def normalise_answer(answer: str) -> str:
    """Collapse whitespace, drop a trailing period and surrounding ``$``: ``" $42$. "`` → ``42``."""
    text = _WS.sub(" ", answer).strip()
    text = text.rstrip(".").strip()
    while len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


def cache_key(signature: str, question: str, label: str, answer: str) -> str:
    """The digest that identifies one verdict (fixed size, whatever the question's length)."""
    h = hashlib.sha256()
    for part in (signature, question, label, normalise_answer(answer)):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


async def wait_shared(fut: asyncio.Future[T]) -> T | None:
    """Await another coroutine's in-flight call; ``None`` if that coroutine was cancelled.

    Cancelling the owner of a shared call must not cancel its waiters: they get ``None`` and
    make the call themselves. Cancelling the waiter itself still cancels it.
    """
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if fut.cancelled() and (task is None or not task.cancelling()):
            return None
        raise


class VerdictCache(Generic[T]):
    """LRU cache of verdicts with in-flight sharing; ``store_if`` decides what is kept."""

    def __init__(self, max_entries: int = 65536) -> None:
        self.max_entries = max_entries
        self._done: OrderedDict[str, T] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[T]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._done)

    def clear(self) -> None:
        """Forget every stored verdict (in-flight calls still complete)."""
        self._done.clear()

    def get(self, key: str) -> T | None:
        """A stored verdict, or ``None``."""
        value = self._done.get(key)
        if value is not None:
            self._done.move_to_end(key)
        return value

    def put(self, key: str, value: T) -> None:
        """Store a verdict, evicting the least recently used past ``max_entries``."""
        self._done[key] = value
        self._done.move_to_end(key)
        while len(self._done) > self.max_entries:
            self._done.popitem(last=False)

    def pending(self, key: str) -> asyncio.Future[T] | None:
        """The in-flight call for ``key`` started on the running loop, if any."""
        fut = self._inflight.get(key)
        if fut is None or fut.done() or fut.get_loop() is not asyncio.get_running_loop():
            return None
        return fut

    async def get_or_compute(
        self,
        key: str,
        compute: Callable[[], Awaitable[T]],
        *,
        store_if: Callable[[T], bool],
    ) -> tuple[T, bool]:
        """Return ``(value, was_hit)``: a stored or in-flight verdict, else ``compute()``'s."""
        stored = self.get(key)
        if stored is not None:
            self.hits += 1
            return stored, True
        fut = self.pending(key)
        if fut is not None:
            shared = await wait_shared(fut)
            if shared is not None:
                self.hits += 1
                return shared, True
        self.misses += 1
        fut = self.begin(key)
        try:
            value = await compute()
        except BaseException as err:
            self.fail(key, fut, err)
            raise
        self.finish(key, fut, value, store=store_if(value))
        return value, False

    def begin(self, key: str) -> asyncio.Future[T]:
        """Register an in-flight call for ``key`` on the running loop (use with ``finish``)."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        return fut

    def finish(self, key: str, fut: asyncio.Future[T], value: T, *, store: bool) -> None:
        """Resolve an in-flight call; store its value when ``store``."""
        if store:
            self.put(key, value)
        if self._inflight.get(key) is fut:
            del self._inflight[key]
        if not fut.done():
            fut.set_result(value)

    def fail(self, key: str, fut: asyncio.Future[T], err: BaseException) -> None:
        """Resolve an in-flight call with its error (waiters see it too; nothing is stored)."""
        if self._inflight.get(key) is fut:
            del self._inflight[key]
        if not fut.done():
            if isinstance(err, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(err)
                # A future nobody awaited must not log "exception was never retrieved".
                fut.exception()
