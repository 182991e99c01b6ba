"""Splitting a global batch across data-parallel ranks by token count (pure, no Ray, no torch)."""

from __future__ import annotations

from collections.abc import Sequence

from rl_core.backends.base import TrainItem


def split_by_tokens(items: Sequence[TrainItem], world_size: int) -> list[list[int]]:
    """Item indices per rank, balancing tokens: longest first, each to the lightest rank.

    Why by tokens: a rank's step time is its forward + backward over its tokens, so equal counts
    of samples of unequal lengths would leave ranks idle at the all-reduce. Each rank's indices
    come back in input order (deterministic; the same split for the same batch).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be ≥ 1, got {world_size}")
    loads = [0] * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    order = sorted(range(len(items)), key=lambda i: (-len(items[i].tokens), i))
    for i in order:
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shards[rank].append(i)
        loads[rank] += len(items[i].tokens)
    return [sorted(s) for s in shards]
