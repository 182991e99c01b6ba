"""Group-normalised (GRPO) advantages that keep judge failures out of the baseline.

GRPO scores each sample against the other samples of its prompt: ``A = (r - mean) / std``. A
sample whose judge failed has no reward (``None``); counting it as 0 would hand every other sample
of its group a false positive advantage, so it is left out of its group's mean and std here and
masked out of the loss (its advantage is 0 and ``valid`` is False). :func:`sample_advantages`
applies the rule to a batch of samples, with the loss's own membership (``Sample.in_loss``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from rl_core.sample import Sample


@dataclass(frozen=True)
class Advantages:
    """Per-sample advantages, whether each sample is in the loss, and what the groups were."""

    values: list[float]
    valid: list[bool]
    num_groups: int
    num_degenerate_groups: int  # groups whose valid rewards are all equal: nothing to learn


def grpo_advantages(
    rewards: Sequence[float | None],
    group_ids: Sequence[int],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Advantages:
    """Compute GRPO advantages.

    Args:
        rewards: one reward per sample; ``None`` marks a judge failure.
        group_ids: the prompt group of each sample.
        normalize_std: divide by the group's standard deviation (Bessel-corrected, as
            ``torch.std``); otherwise only subtract the group mean (Dr. GRPO style).
        eps: added to the std so an all-equal group gives 0, not a division by zero.

    A group with a single valid sample has no baseline: its advantage is 0.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[int, list[int]] = defaultdict(list)
    for i, (reward, gid) in enumerate(zip(rewards, group_ids, strict=True)):
        if reward is not None:
            if not math.isfinite(reward):
                raise ValueError(f"reward of sample {i} is {reward}; rewards must be finite")
            members[gid].append(i)
    values = [0.0] * len(rewards)
    degenerate = 0
    for idx in members.values():
        group = [float(rewards[i]) for i in idx]  # type: ignore[arg-type]
        mean = sum(group) / len(group)
        if len(group) < 2 or max(group) == min(group):
            degenerate += 1
            continue
        scale = 1.0
        if normalize_std:
            var = sum((r - mean) ** 2 for r in group) / (len(group) - 1)
            scale = math.sqrt(var) + eps
        for i, r in zip(idx, group, strict=True):
            values[i] = (r - mean) / scale
    all_groups = set(group_ids)
    degenerate += len(all_groups - set(members))  # groups where every judge call failed
    valid = [r is not None for r in rewards]
    return Advantages(
        values=values, valid=valid, num_groups=len(all_groups), num_degenerate_groups=degenerate
    )


def sample_advantages(batch: Sequence[Sample], *, normalize_std: bool = True) -> Advantages:
    """GRPO advantages over the samples in the loss, written to each ``sample.advantage``; the
    others get 0 and stay out of their group's mean and std (one membership rule for both:
    ``Sample.in_loss``)."""
    adv = grpo_advantages(
        [s.reward if s.in_loss else None for s in batch],
        [s.group_id for s in batch],
        normalize_std=normalize_std,
    )
    for s, a, ok in zip(batch, adv.values, adv.valid, strict=True):
        s.advantage = a if ok else 0.0
    return adv
