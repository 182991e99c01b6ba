"""The radix tree of a batch's prompts: which runs of tokens several prompts share.

A judge batch is GRPO groups whose samples share template + question + reference. Both engines
use the tree: the hf engine computes every node once in a packed prefill (``hf/packing.py``);
the SGLang engine has each group's shared run computed first, so that SGLang's radix cache holds
it when the group's members arrive (``sglang.py``). Plain Python: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MIN_SHARED_TOKENS", "PrefixNode", "build_forest", "common_prefix_len"]

#: A run shared by several rows but shorter than this is recomputed per branch instead of
#: becoming a tree node of its own: every tree depth is one more attention call per layer.
MIN_SHARED_TOKENS = 16


@dataclass
class PrefixNode:
    """A run of prompt tokens that the rows below it share; ``start`` is its first position."""

    start: int
    tokens: list[int]
    depth: int
    parent: PrefixNode | None
    #: rows whose prompt ends at this node's last token
    ending: list[int] = field(default_factory=list)
    children: list[PrefixNode] = field(default_factory=list)
    #: index of the first token in the packed sequence
    offset: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    A binary search over slice equality (compared in C): the plan of a judge batch is built while
    the GPU waits, and a token-by-token loop over 64 prompts of ~700 tokens cost ~2 ms of it."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # invariant: a[:lo] == b[:lo]; the answer is at most hi
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_len(prompts: list[list[int]], rows: list[int], start: int) -> int:
    """Length of the run, from ``start``, common to every row of ``rows``."""
    tails = [prompts[r][start:] for r in rows]
    # the lexicographic extremes share exactly the prefix that all of them share
    return common_prefix_len(min(tails), max(tails))


def build_forest(prompts: list[list[int]], min_shared: int = MIN_SHARED_TOKENS) -> list[PrefixNode]:
    """The radix tree of ``prompts`` (a forest: rows need not share a first token).

    A shared run shorter than ``min_shared`` is not made a node of its own but repeated in each
    branch below it (see :data:`MIN_SHARED_TOKENS`).
    """

    def grow(
        rows: list[int], start: int, depth: int, parent: PrefixNode | None
    ) -> list[PrefixNode]:
        run = _common_len(prompts, rows, start)
        end = start + run
        ending = [r for r in rows if len(prompts[r]) == end]
        if len(rows) > 1 and run < min_shared and not ending:
            # Too short to share: split by the first differing token, each branch from ``start``.
            nodes: list[PrefixNode] = []
            for group in _by_token(prompts, rows, end).values():
                nodes.extend(grow(group, start, depth, parent))
            return nodes
        node = PrefixNode(start, prompts[rows[0]][start:end], depth, parent, ending)
        rest = [r for r in rows if len(prompts[r]) > end]
        for group in _by_token(prompts, rest, end).values():
            node.children.extend(grow(group, end, depth + 1, node))
        return [node]

    return grow(list(range(len(prompts))), 0, 1, None)


def _by_token(prompts: list[list[int]], rows: list[int], at: int) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for r in rows:
        groups.setdefault(prompts[r][at], []).append(r)
    return groups
