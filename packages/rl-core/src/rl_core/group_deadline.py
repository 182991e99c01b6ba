"""A deadline per group (``--group-judge-deadline-s``): a group's scoring stops that long after
its last response arrives.

One slow judge call (a stuck engine, a long thinking reply) otherwise holds the whole step: the
trainer waits for every reward. With a deadline, what is not judged by then is left out with a
status of its own, ``judge_timeout`` — out of the loss and the group's baseline like a judge
error, never a 0, and counted per step (``rollout/judge_timeouts``) but not against
``--max-judge-error-fraction``: a deadline is a choice, not an outage. A group left with fewer
than two scored responses trains nothing: the lone one has no baseline (``no_baseline``).

The clock starts when the group is handed to scoring: inline, when its last response is done;
in defer mode, when the post-process hook starts scoring the batch (the judge slept until
then). A per-sample reward is cut per sample (the ones judged in time keep their scores); a
group-level reward (``pairwise-genrm``) reads the same setting and stops its own comparisons
at the deadline, with :data:`GRACE_S` more before rl-core abandons the call. Without a
deadline nothing here runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from genrm_rewards.types import BatchRewardFn, judge_timeout_result
from rl_core.sample import Sample

__all__ = ["GRACE_S", "by_group", "leave_lone_out", "score_group_by", "score_samples_by"]

logger = logging.getLogger(__name__)

#: How long after the deadline rl-core abandons a group-level reward's call (the reward stops
#: its own comparisons at the deadline and answers with what it has; this is the backstop).
GRACE_S = 5.0


def _timeout(sample: Sample, deadline_s: float, reward_key: str) -> None:
    sample.apply_reward(dict(judge_timeout_result(deadline_s)), reward_key)


def leave_lone_out(group: Sequence[Sample]) -> int:
    """A group with fewer than two responses in the loss trains nothing: mark the lone one
    ``no_baseline``. Returns how many were marked."""
    scored = [s for s in group if s.in_loss]
    if len(scored) >= 2:
        return 0
    for s in scored:
        s.no_baseline = True
    return len(scored)


async def score_samples_by(
    deadline_s: float,
    score: Callable[[Sample], Awaitable[None]],
    group: Sequence[Sample],
    reward_key: str,
) -> None:
    """Score each sample of ``group`` with ``score(sample)`` (a coroutine that applies its
    result), stopping at the deadline: the samples still unscored become ``judge_timeout``."""
    tasks = [asyncio.ensure_future(score(s)) for s in group]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=deadline_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in tasks:  # a bug in the reward function still stops the run
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
    late = [s for s in group if s.status == "pending"]
    for s in late:
        _timeout(s, deadline_s, reward_key)
    if late:
        logger.warning(
            "group %s: %d of %d responses not judged within --group-judge-deadline-s %g",
            group[0].group_id,
            len(late),
            len(group),
            deadline_s,
        )
    leave_lone_out(group)


async def score_group_by(
    deadline_s: float,
    batch_fn: BatchRewardFn,
    args: Any,
    group: list[Sample],
    reward_key: str,
    *,
    grace_s: float = GRACE_S,
) -> None:
    """Score ``group`` with a batch (group-level) reward under the deadline: a call still
    running ``grace_s`` after it is abandoned and the group's samples are ``judge_timeout``."""
    from rl_core.rewards import score_batch

    if not group:
        return
    try:
        await asyncio.wait_for(score_batch(batch_fn, args, group, reward_key), deadline_s + grace_s)
    except TimeoutError:
        logger.warning(
            "group %s: its reward did not answer within --group-judge-deadline-s %g (+%g s)",
            group[0].group_id,
            deadline_s,
            grace_s,
        )
        for s in group:
            _timeout(s, deadline_s, reward_key)
    leave_lone_out(group)


def by_group(samples: Sequence[Sample]) -> list[list[Sample]]:
    """``samples`` split into their groups, in order of first appearance."""
    groups: dict[int, list[Sample]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s)
    return list(groups.values())
