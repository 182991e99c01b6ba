"""The defer-swap hook of ``run-qwen35-35B-A3B-16xgpu-genrm-397B-defer.sh``: score a whole batch.

    --rm-type dummy --defer-reward-to-post-process --custom-reward-post-process-path
    examples.generate_reward_model.post_process_genrm_swap.post_process

The swap itself is rl-core's, from the placement plan (``rl_core.rewards.custom_post_process``
around this function): after the rollout the rollout engines sleep and the judge wakes, then
``post_process`` runs, then the judge sleeps and the actor trains. So this function only scores:
here with the batch variant of a registered reward (dapo-genrm: the n answers of a prompt share
one ``generate_batch`` request and the verdict cache). As it is, it does what
``--builtin-reward-post-process`` does; copy it to change what a user changes:

* ``REWARD``: which registered reward scores the batch (``dapo-genrm``, ``dual-genrm``, ...);
* anything that needs the whole batch at once (e.g. reshape scores per group, drop a group);
  return one dict per sample (``score``, ``status``, ...), or ``None`` after setting
  ``sample.reward`` / ``sample.status`` yourself.

A judge failure comes back per sample as ``status="judge_error"`` with ``score=None`` (never 0);
if a hook lets a genrm-client error escape, rl-core marks the whole batch ``judge_error``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from genrm_rewards.registry import get_batch_reward_fn
from genrm_rewards.types import SampleLike

#: The reward that scores the deferred batch.
REWARD = "dapo-genrm"


async def post_process(args: Any, samples: Sequence[SampleLike]) -> list[Mapping[str, Any]]:
    """One result per sample, in order; the judge is awake and the rollout asleep meanwhile."""
    return list(await get_batch_reward_fn(REWARD)(args, samples))
