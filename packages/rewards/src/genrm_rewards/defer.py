"""Defer mode: ``--rm-type dummy`` inline, the real reward over the whole batch afterwards.

In the shared / defer-swap layout the judge sleeps during rollout, so the inline reward is a
placeholder (``rules.dummy``: score 0, status ``"deferred"``, so nobody mistakes it for a
verdict). After the batch, the post-process hook (rl-core) wakes the judge and calls
``score_deferred``, which scores every sample with ``args.deferred_rm_type`` (default
``dapo-genrm``) through its batch variant — one ``generate_batch`` per call, the verdict cache
shared across groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from genrm_rewards.args import resolve_args
from genrm_rewards.registry import get_batch_reward_fn
from genrm_rewards.types import SampleLike

__all__ = ["score_deferred"]


async def score_deferred(args: Any, samples: Sequence[SampleLike]) -> Sequence[Mapping[str, Any]]:
    """Score a whole rollout batch with ``args.deferred_rm_type`` (for the post-process hook)."""
    settings = resolve_args(args)
    if settings.deferred_rm_type == "dummy":
        raise ValueError("args.deferred_rm_type='dummy' would defer forever; name a real reward")
    return await get_batch_reward_fn(settings.deferred_rm_type)(args, samples)
