"""Which engine serves a request: the least loaded, or its prefix key's home, bounded by load.

The router's one decision, kept pure: the engines' state in (serving or not, requests in
flight), a choice out. Nothing here waits, calls an engine or changes a count: the router holds
that state, asks ``choose_engine`` whenever a request could start, and acts on the answer, so
every rule below is tested on plain data (``test_router_policy``).

**Load.** An engine takes a request while it has room: fewer than ``inflight_limit`` in flight
after it, or nothing in flight at all (a batch larger than the limit still goes to an idle
engine). Of the serving engines with room, the one with the fewest in flight wins; ties go to
the first in turn from ``start`` (the router passes the engine after its last choice, so ties go
round-robin). An engine's sleep is no input: a sleeping engine refuses, and the router fails
the request over as for any engine failure (with engines shared by several ingress replicas, a
probe's word on sleep can be stale).

**Affinity.** A GRPO group's judge prompts share a long prefix (the question and the
reference); an engine's prefix cache (SGLang's radix cache, the hf engine's packed prefixes)
reuses it only for requests that reach that engine. A request may carry an affinity key
(``prefix_key``); its *home* is the engine that ranks first for the key by rendezvous
(highest-random-weight) hashing over the engines that can serve now. The ranking of each engine
depends only on the key and that engine, so an engine going down moves only the keys it was
home to (each to its next-ranked engine), and coming back takes back only those.

Affinity never makes the router worse than load alone: the home is taken only when it has room
and holds at most ``slack`` requests more than the least-loaded engine; otherwise the request
goes to the least-loaded engine (a *spill*). A hot key therefore costs cache hits, never a queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = [
    "Choice",
    "EngineLoad",
    "affinity_slack",
    "choose_engine",
    "has_room",
    "home_of",
    "least_loaded",
    "rendezvous_weight",
    "serving_home",
]


class _Named(Protocol):
    @property
    def engine_id(self) -> str: ...


class EngineLoad(_Named, Protocol):
    """What the policy reads of an engine (``EngineSlot`` has it)."""

    @property
    def healthy(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...


N = TypeVar("N", bound=_Named)
E = TypeVar("E", bound=EngineLoad)


@dataclass(frozen=True)
class Choice(Generic[E]):
    """The engine a request goes to."""

    engine: E
    #: With a key: True when ``engine`` is the key's home, False when the request spilled to the
    #: least-loaded engine (the router counts both). None without a key.
    home: bool | None = None


def rendezvous_weight(key: str, engine_id: str) -> int:
    """The key's weight on one engine (64 bits of a hash of both; stable across processes)."""
    digest = hashlib.blake2b(f"{key}\x00{engine_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def home_of(key: str, engines: Iterable[N]) -> N | None:
    """The engine of ``engines`` that ``key`` belongs to (None when there is none)."""
    return max(engines, key=lambda e: rendezvous_weight(key, e.engine_id), default=None)


def affinity_slack(inflight_limit: int) -> int:
    """How many requests more than the least-loaded engine a key's home may hold and still be
    chosen: an eighth of an engine's in-flight limit, at least 2 (a group of 8 at the default
    limit of 2 × max_batch_size 32 = 64 stays together while the other engines are idle)."""
    return max(2, inflight_limit // 8)


def _serving(engines: Iterable[E], exclude: Collection[str]) -> Iterator[E]:
    return (e for e in engines if e.healthy and e.engine_id not in exclude)


def serving_home(key: str, engines: Iterable[E], exclude: Collection[str] = ()) -> E | None:
    """``key``'s home among the engines serving now, less ``exclude`` (engine ids)."""
    return home_of(key, _serving(engines, exclude))


def has_room(engine: EngineLoad, n: int, inflight_limit: int) -> bool:
    """Whether ``engine`` takes ``n`` more requests: within its limit, or idle."""
    return engine.in_flight + n <= inflight_limit or engine.in_flight == 0


def least_loaded(
    engines: Sequence[E],
    n: int,
    *,
    inflight_limit: int,
    exclude: Collection[str] = (),
    start: int = 0,
) -> E | None:
    """The serving engine with room for ``n`` and the fewest in flight; of equals, the first in
    turn from ``engines[start]``. None when no engine serves with room."""
    best: E | None = None
    count = len(engines)
    for i in range(count):
        engine = engines[(start + i) % count]
        if not engine.healthy or engine.engine_id in exclude:
            continue
        if not has_room(engine, n, inflight_limit):
            continue
        if best is None or engine.in_flight < best.in_flight:
            best = engine
    return best


def choose_engine(
    engines: Sequence[E],
    n: int = 1,
    key: str | None = None,
    *,
    inflight_limit: int,
    slack: int,
    exclude: Collection[str] = (),
    start: int = 0,
) -> Choice[E] | None:
    """Where ``n`` requests (one, or a batch sent as one call) go now.

    Args:
        engines: the instance's engines, in a fixed order (``start`` indexes it).
        n: the requests to place together.
        key: their prefix key, if any: its home is taken while it has room and holds at most
            ``slack`` more than the least-loaded engine.
        inflight_limit: the requests an engine holds at once (an idle one takes any ``n``).
        slack: see ``affinity_slack``.
        exclude: engine ids left out (the engine a retry must avoid).
        start: where the search for the least loaded begins (ties go to the first from there).

    Returns:
        The choice, or None when no engine serves with room (the request waits, or fails).
    """
    best = least_loaded(engines, n, inflight_limit=inflight_limit, exclude=exclude, start=start)
    if best is None or key is None:
        return None if best is None else Choice(best)
    home = serving_home(key, engines, exclude)
    if (
        home is not None
        and has_room(home, n, inflight_limit)
        and home.in_flight <= best.in_flight + slack
    ):
        return Choice(home, home=True)
    return Choice(best, home=best is home)
