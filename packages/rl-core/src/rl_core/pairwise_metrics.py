"""How often a pairwise judge's verdict flipped with the order of the two responses.

``pairwise-genrm`` asks each pair in both orders; a pair whose winner changed when the two
responses swapped places was decided by position, not content. Each result reports, for its
own response, the pairs answered in both orders and those that flipped (``details.pairwise``);
every pair is counted by both of its responses, so the sums' ratio is the step's share.
A judge near 1.0 is a coin with a position bias; near 0.0 it reads the responses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_core.sample import Sample

__all__ = ["pairwise_flips"]


def pairwise_flips(samples: Sequence[Sample], prefix: str) -> dict[str, Any]:
    """``{prefix}pairwise_flip_share`` (None when no pair was answered in both orders) and
    ``{prefix}pairwise_pairs`` (pairs answered in both orders); empty for other rewards."""
    flipped = pairs = 0
    seen = False
    for s in samples:
        part = s.reward_details.get("details", {})
        counts = part.get("pairwise") if isinstance(part, dict) else None
        if not isinstance(counts, dict):
            continue
        seen = True
        flipped += int(counts.get("flipped_pairs", 0))
        pairs += int(counts.get("both_order_pairs", 0))
    if not seen:
        return {}
    return {
        f"{prefix}pairwise_flip_share": flipped / pairs if pairs else None,
        f"{prefix}pairwise_pairs": pairs // 2,
    }
