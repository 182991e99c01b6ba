"""Which engine a prefix key belongs to: rendezvous hashing, bounded by load.

A GRPO group's judge prompts share a long prefix (the question and the reference); an engine's
prefix cache (SGLang's radix cache, the hf engine's packed prefixes) reuses it only for requests
that reach that engine. A request may carry an affinity key (``prefix_key``); its *home* is the
engine that ranks first for the key by rendezvous (highest-random-weight) hashing over the
engines that can serve now. The ranking of each engine depends only on the key and that engine,
so an engine going down moves only the keys it was home to (each to its next-ranked engine),
and coming back takes back only those.

Affinity never makes the router worse than load alone: the home is taken only when it has room
and holds at most ``slack`` requests more than the least-loaded engine; otherwise the request
goes to the least-loaded engine (a *spill*). A hot key therefore costs cache hits, never a queue.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol, TypeVar

__all__ = ["affinity_slack", "home_of", "rendezvous_weight"]


class _Engine(Protocol):
    @property
    def engine_id(self) -> str: ...


E = TypeVar("E", bound=_Engine)


def rendezvous_weight(key: str, engine_id: str) -> int:
    """The key's weight on one engine (64 bits of a hash of both; stable across processes)."""
    digest = hashlib.blake2b(f"{key}\x00{engine_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def home_of(key: str, engines: Iterable[E]) -> E | None:
    """The engine of ``engines`` that ``key`` belongs to (None when there is none)."""
    return max(engines, key=lambda e: rendezvous_weight(key, e.engine_id), default=None)


def affinity_slack(inflight_limit: int) -> int:
    """How many requests more than the least-loaded engine a key's home may hold and still be
    chosen: an eighth of an engine's in-flight limit, at least 2 (a group of 8 at the default
    limit of 2 × max_batch_size 32 = 64 stays together while the other engines are idle)."""
    return max(2, inflight_limit // 8)
