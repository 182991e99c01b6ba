"""Scoring samples: inline as each sample finishes, or deferred to a post-process hook.

Inline: every finished sample gets a task that calls the reward function under a semaphore
(``--reward-concurrency``), overlapping the rest of the rollout; the time the trainer then still
waits for rewards is measured on its own. Deferred (``--rm-type dummy
--defer-reward-to-post-process``): the dummy placeholder first, then a post-process hook scores the
whole batch. The built-in hook owns the defer-swap sequence — rollout engines sleep, judge wakes,
batch scored, judge sleeps — so users do not write it; ``--custom-reward-post-process-path``
replaces the scoring (not the swap) with ``async def hook(args, samples) -> list[dict] | None``
(results to apply, or ``None`` when the hook set ``sample.reward`` / ``status`` itself).

rl-core's own reward functions are handed the run's judge client (:func:`reward_setup`); they do
not look for the judge service in the environment.

A reward function that raises is recorded as ``judge_error`` on that sample (with the error), never
as 0, and the step's judge-error budget decides whether training continues.

A group-level reward (``pairwise-genrm``: a response's score depends on the rest of its group)
is scored inline once per complete group, through its batch variant, and in defer mode over the
batch as any other. ``--group-judge-deadline-s`` puts a deadline on each group's scoring, in
both modes (``rl_core.group_deadline``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from genrm_client import GenRMError
from genrm_rewards.types import BatchRewardFn, JudgeClient, RewardFn, SampleLike
from rl_core.limits import REWARD_TIMEOUT_S
from rl_core.phases import PhaseMachine
from rl_core.sample import Sample

logger = logging.getLogger(__name__)

PostProcessHook = Callable[["PostProcessContext", list[Sample]], Awaitable[None]]
F = TypeVar("F", bound=Callable[..., Any])


class JudgeFailureError(RuntimeError):
    """Too many samples of a step have no reward: training on the rest would train on noise."""


class UnscoredSamplesError(RuntimeError):
    """A post-process hook left samples in the ``deferred`` state."""


#: What a judge failure looks like once a reward function lets it through: the client's errors
#: and our own deadline. Anything else is a bug in the reward function and stops the run with its
#: traceback — masking it as a judge error would quietly drop a systematic subset of samples.
JUDGE_FAILURES = (GenRMError, TimeoutError)


def _error_result(err: BaseException) -> dict[str, Any]:
    return {"score": None, "status": "judge_error", "error": f"{type(err).__name__}: {err}"}


class InlineRewards:
    """Scores samples as they are handed in; :meth:`drain` waits for the outstanding ones.

    ``fn`` scores one sample; ``group_fn`` (instead) a whole group as :meth:`submit` hands it
    in, outside the per-sample semaphore (one call per group). ``deadline_s``: each handed-in
    group's scoring stops that long after (``rl_core.group_deadline``).
    """

    def __init__(
        self,
        fn: RewardFn | None,
        args: Any,
        *,
        reward_key: str,
        concurrency: int,
        group_fn: BatchRewardFn | None = None,
        deadline_s: float | None = None,
    ) -> None:
        if (fn is None) == (group_fn is None):
            raise ValueError("InlineRewards needs exactly one of fn and group_fn")
        self.fn = fn
        self.group_fn = group_fn
        self.deadline_s = deadline_s
        self.args = args
        self.reward_key = reward_key
        self._sem = asyncio.Semaphore(concurrency)
        self._tasks: list[asyncio.Task[None]] = []

    async def _score(self, sample: Sample) -> None:
        assert self.fn is not None
        async with self._sem:
            try:
                result = await asyncio.wait_for(self.fn(self.args, sample), REWARD_TIMEOUT_S)
            except JUDGE_FAILURES as err:  # an outage: a judge error, never a 0
                logger.warning(
                    "reward of sample g%s/%s failed: %s", sample.group_id, sample.index, err
                )
                result = _error_result(err)
        sample.apply_reward(dict(result), self.reward_key)

    async def _score_group(self, group: list[Sample]) -> None:
        from rl_core.group_deadline import score_group_by, score_samples_by

        if self.group_fn is not None:
            if self.deadline_s is None:
                await score_batch(self.group_fn, self.args, group, self.reward_key)
            else:
                await score_group_by(
                    self.deadline_s, self.group_fn, self.args, group, self.reward_key
                )
        else:
            assert self.deadline_s is not None
            await score_samples_by(self.deadline_s, self._score, group, self.reward_key)

    def submit(self, samples: Sequence[Sample]) -> None:
        """Score ``samples``: one complete group (``RolloutScorer`` hands each in as it is
        done), per sample or, for a group-level reward or under a deadline, as a group."""
        if self.group_fn is None and self.deadline_s is None:
            for s in samples:
                self._tasks.append(asyncio.ensure_future(self._score(s)))
        elif samples:
            self._tasks.append(asyncio.ensure_future(self._score_group(list(samples))))

    async def drain(self) -> None:
        tasks, self._tasks = self._tasks, []
        if tasks:
            await asyncio.gather(*tasks)


async def score_batch(
    batch_fn: BatchRewardFn, args: Any, samples: list[Sample], reward_key: str
) -> None:
    """Score a whole batch with a batch reward function and apply the results."""
    try:
        results = list(await asyncio.wait_for(batch_fn(args, samples), REWARD_TIMEOUT_S))
    except JUDGE_FAILURES as err:
        logger.warning("batch reward failed for %d samples: %s", len(samples), err)
        results = [_error_result(err)] * len(samples)
    if len(results) != len(samples):
        raise RuntimeError(f"batch reward returned {len(results)} results for {len(samples)}")
    for s, r in zip(samples, results, strict=True):
        s.apply_reward(dict(r), reward_key)


@dataclass
class PostProcessContext:
    """What a post-process hook may use: the run's args, the phase machine, the batch scorer."""

    args: Any
    phases: PhaseMachine
    batch_fn: BatchRewardFn
    reward_key: str
    #: ``--group-judge-deadline-s``: the built-in hook scores each group under it
    deadline_s: float | None = None


async def _wake_judges(ctx: PostProcessContext) -> None:
    """The swap before a deferred batch is scored: rollout sleeps, judge wakes (per the plan)."""
    if "reward" in ctx.phases.phases:
        await ctx.phases.enter("reward")
    else:  # a mode without a reward phase: just make sure the judges are up
        for who in ctx.phases.judges():
            await ctx.phases.set_state(who, "active", reason="reward")


async def _sleep_judges(ctx: PostProcessContext) -> None:
    if "reward" in ctx.phases.phases:
        for who in ctx.phases.judges():
            await ctx.phases.set_state(who, "asleep", reason="reward-done")


async def defer_swap_post_process(ctx: PostProcessContext, samples: list[Sample]) -> None:
    """The built-in defer-swap hook: rollout sleeps → judge wakes → batch scored → judge sleeps."""
    await _wake_judges(ctx)
    if ctx.deadline_s is None:
        await score_batch(ctx.batch_fn, ctx.args, samples, ctx.reward_key)
    else:  # each group on its own clock, from now: the judge has just woken
        from rl_core.group_deadline import by_group, score_group_by

        await asyncio.gather(
            *(
                score_group_by(ctx.deadline_s, ctx.batch_fn, ctx.args, g, ctx.reward_key)
                for g in by_group(samples)
            )
        )
    await _sleep_judges(ctx)


def custom_post_process(fn: Callable[..., Awaitable[Any]]) -> PostProcessHook:
    """Wrap a user hook ``async def hook(args, samples) -> list[dict] | None``.

    The swap stays rl-core's: the user hook runs with the judges awake and the rollout engines
    asleep, exactly where the built-in one scores (a hook cannot reach the engines itself). A
    judge failure it lets through marks the batch ``judge_error``, as an inline reward would.
    """

    async def hook(ctx: PostProcessContext, samples: list[Sample]) -> None:
        await _wake_judges(ctx)
        try:
            results = await fn(ctx.args, samples)
        except JUDGE_FAILURES as err:
            logger.warning("post-process hook failed for %d samples: %s", len(samples), err)
            results = [_error_result(err)] * len(samples)
        await _sleep_judges(ctx)
        if results is not None:
            results = list(results)
            if len(results) != len(samples):
                raise RuntimeError(
                    f"post-process hook returned {len(results)} results for {len(samples)}"
                )
            for s, r in zip(samples, results, strict=True):
                s.apply_reward(dict(r), ctx.reward_key)

    return hook


def judgeable(samples: Sequence[Sample]) -> list[Sample]:
    """The samples a reward may score: an aborted generation is neither judged nor trained."""
    return [s for s in samples if s.status != "aborted"]


def check_scored(samples: Sequence[Sample]) -> None:
    left = [s for s in samples if s.status in ("deferred", "pending")]
    if left:
        raise UnscoredSamplesError(
            f"{len(left)} of {len(samples)} samples are still {left[0].status!r} after the reward "
            "phase: the post-process hook must score every sample (or mark it judge_error)"
        )


def check_judge_errors(samples: Sequence[Sample], max_fraction: float, step: int) -> int:
    """Count judge errors; raise when more than ``max_fraction`` of the step failed."""
    failed = [s for s in samples if s.status == "judge_error"]
    if samples and len(failed) / len(samples) > max_fraction:
        example = failed[0].reward_details.get("error", "no error text")
        raise JudgeFailureError(
            f"step {step}: {len(failed)} of {len(samples)} samples have no reward (judge_error), "
            f"more than --max-judge-error-fraction {max_fraction:g}; stopping instead of training "
            f"on noise. First error: {example}"
        )
    return len(failed)


@dataclass
class RewardSetup:
    """The reward path of a run: inline function, or deferred with a post-process hook."""

    args: Any
    reward_key: str
    inline_fn: RewardFn | None
    batch_fn: BatchRewardFn | None = None
    post_process: PostProcessHook | None = None
    concurrency: int = 32
    #: inline, a group-level reward: scored once per complete group (``inline_fn`` is None)
    group_fn: BatchRewardFn | None = None
    #: ``--group-judge-deadline-s`` (``rl_core.group_deadline``); None: no deadline
    deadline_s: float | None = None

    @property
    def deferred(self) -> bool:
        return self.post_process is not None


def _takes_client(fn: Callable[..., Any]) -> bool:
    try:
        return "client" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a readable signature
        return False


def with_judge(fn: F, judge: JudgeClient | None) -> F:
    """``fn`` with ``client=judge`` bound where it takes a judge client (genrm-rewards' judge
    rewards do); any other function, or no judge, unchanged."""
    if judge is None or not _takes_client(fn):
        return fn
    bound = functools.partial(fn, client=judge)
    return bound  # type: ignore[return-value]


def _deferred_batch_fn(judge: JudgeClient | None) -> BatchRewardFn:
    """``--defer-reward-to-post-process``: the batch is scored by ``deferred_rm_type``'s batch
    function, handed the judge client (genrm-rewards' ``score_deferred`` without one)."""
    from genrm_rewards import as_batch, get_batch_reward_fn, get_reward_fn, resolve_args
    from genrm_rewards.defer import score_deferred

    if judge is None:
        return score_deferred

    async def score(args: Any, samples: Sequence[SampleLike]) -> Sequence[Mapping[str, Any]]:
        name = resolve_args(args).deferred_rm_type
        if name == "dummy":  # score_deferred refuses it, with its own message
            return await score_deferred(args, samples)
        batch = get_batch_reward_fn(name)
        if _takes_client(batch):
            return await with_judge(batch, judge)(args, samples)
        fn = get_reward_fn(name)
        if _takes_client(fn):  # no batch variant of its own: the per-sample one over the batch
            batch = as_batch(with_judge(fn, judge))
        return await batch(args, samples)

    return score


def reward_setup(cfg: Any, judge: JudgeClient | None = None) -> RewardSetup:
    """The reward path the config asks for; ``judge``: the client of the run's judge service,
    handed to every reward function that takes one."""
    from genrm_rewards import get_batch_reward_fn, is_group_level, load_custom, resolve_reward_fn

    deadline = getattr(cfg, "group_judge_deadline_s", None)
    if cfg.defer_reward_to_post_process:
        hook: PostProcessHook = defer_swap_post_process
        if cfg.custom_reward_post_process_path:
            user_hook = load_custom(
                cfg.custom_reward_post_process_path, setting="--custom-reward-post-process-path"
            )
            hook = custom_post_process(user_hook)
        return RewardSetup(
            args=cfg,
            reward_key=cfg.reward_key,
            inline_fn=None,
            batch_fn=_deferred_batch_fn(judge),
            post_process=hook,
            concurrency=cfg.reward_concurrency,
            deadline_s=deadline,
        )
    if not cfg.custom_rm_path and is_group_level(cfg.rm_type or "dapo-genrm"):
        return RewardSetup(
            args=cfg,
            reward_key=cfg.reward_key,
            inline_fn=None,
            group_fn=with_judge(get_batch_reward_fn(cfg.rm_type), judge),
            concurrency=cfg.reward_concurrency,
            deadline_s=deadline,
        )
    return RewardSetup(
        args=cfg,
        reward_key=cfg.reward_key,
        inline_fn=with_judge(resolve_reward_fn(cfg), judge),
        concurrency=cfg.reward_concurrency,
        deadline_s=deadline,
    )
