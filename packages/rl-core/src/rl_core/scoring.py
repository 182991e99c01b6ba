"""Generate and score: samples from the rollout engines, each scored by the run's reward path.

The one path of every sample that is judged — a training step's rollout, the evaluation inside a
run, and ``rl-core eval`` — so an evaluation's figure depends on the weights, the data and the
flags, never on which command produced it. The sampling settings come from the config here too
(:func:`rollout_settings`), for the same reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_core.config import TrainConfig
from rl_core.engines import EngineHandle
from rl_core.metrics import PhaseClock, PhaseTimes
from rl_core.phases import PhaseMachine
from rl_core.rewards import InlineRewards, PostProcessContext, RewardSetup, judgeable
from rl_core.rollout import RolloutSettings, generate_groups
from rl_core.sample import Sample

__all__ = ["RolloutScorer", "rollout_settings"]


def rollout_settings(cfg: TrainConfig, *, seeded: bool) -> RolloutSettings:
    """A run's training sampling, from its flags (an evaluation's is derived from it:
    ``Evaluation.settings``); ``seeded``: the engines honour a per-request seed."""
    return RolloutSettings(
        n_samples_per_prompt=cfg.n_samples_per_prompt,
        max_response_len=cfg.rollout_max_response_len,
        temperature=cfg.rollout_temperature,
        top_p=cfg.rollout_top_p,
        top_k=cfg.rollout_top_k,
        stop=tuple(cfg.rollout_stop or ()),
        apply_chat_template=cfg.apply_chat_template,
        max_prompt_len=cfg.rollout_max_prompt_len,
        need_logprobs=cfg.use_tis,
        # the run's seed reaches the rollout engines' sampling (not where they cannot honour it)
        seed=cfg.seed if seeded else None,
        keep_cut_off=cfg.keep_cut_off,
    )


class RolloutScorer:
    """Generates groups on the rollout engines and scores every sample with the reward path."""

    def __init__(
        self,
        engines: Sequence[EngineHandle],
        tokenizer: Any,
        rewards: RewardSetup,
        phases: PhaseMachine,
        clock: PhaseClock,
    ) -> None:
        self.engines = list(engines)
        self.tokenizer = tokenizer
        self.rewards = rewards
        self.phases = phases
        self.clock = clock

    async def __call__(
        self,
        groups: list[list[Sample]],
        settings: RolloutSettings,
        *,
        seed_key: tuple[int, int],
        label: str,
        times: PhaseTimes,
    ) -> list[Sample]:
        """Generate ``groups`` and score every sample: inline as each group finishes, or the
        whole batch afterwards through the post-process hook; timed into ``times`` as ``label``
        and ``reward_wait`` (inline: what the rewards still took after the rollout) or
        ``reward``."""
        rewards = self.rewards
        inline = None
        if not rewards.deferred:
            inline = InlineRewards(
                rewards.inline_fn,
                rewards.args,
                reward_key=rewards.reward_key,
                concurrency=rewards.concurrency,
                group_fn=rewards.group_fn,
                deadline_s=rewards.deadline_s,
            )
        n = sum(len(g) for g in groups)
        with self.clock.phase(label, total=n, times=times) as advance:

            def done(group: list[Sample]) -> None:
                advance(len(group))
                if inline is not None:
                    inline.submit(judgeable(group))

            await generate_groups(
                self.engines, groups, self.tokenizer, settings, done, seed_key=seed_key
            )
        samples = [s for g in groups for s in g]
        waited = "reward_wait" if inline is not None else "reward"
        with self.clock.phase("reward", total=None, times=times, key=waited):
            if inline is not None:
                await inline.drain()
            else:
                assert rewards.post_process is not None and rewards.batch_fn is not None
                ctx = PostProcessContext(
                    rewards.args,
                    self.phases,
                    rewards.batch_fn,
                    rewards.reward_key,
                    deadline_s=rewards.deadline_s,
                )
                await rewards.post_process(ctx, judgeable(samples))
        return samples

    async def awake(
        self, groups: list[list[Sample]], settings: RolloutSettings, **how: Any
    ) -> list[Sample]:
        """:meth:`__call__` outside a training step (an evaluation): the rollout
        engines are woken first, and woken again after a deferred batch (whose scoring put them
        to sleep)."""
        if self.phases.current != "inference":
            await self.phases.enter("inference")
        samples = await self(groups, settings, **how)
        if self.rewards.deferred:
            await self.phases.enter("inference")
        return samples
