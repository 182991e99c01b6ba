"""Group-level rewards and the deadline per group, without Ray: what is not judged by a
group's deadline is ``judge_timeout`` (left out of the loss and the baseline, counted, never
0), a group left with fewer than two scored responses trains nothing, and without a deadline
the scoring is what it was. ``pairwise-genrm`` runs inline once per complete group and in
defer mode over the batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from genrm_client import GenerateResponse
from rl_core.config import build_config
from rl_core.grpo.advantages import sample_advantages
from rl_core.pairwise_metrics import pairwise_flips
from rl_core.rewards import (
    InlineRewards,
    PostProcessContext,
    check_judge_errors,
    defer_swap_post_process,
    reward_setup,
)
from rl_core.sample import Sample
from rl_core.trainer import untrained_reason


def _group(gid: int, answers: Sequence[str]) -> list[Sample]:
    out = []
    for i, a in enumerate(answers):
        s = Sample(prompt="Say something.", label="7", metadata={"question": "Q"}, group_id=gid)
        s.index, s.response, s.response_tokens, s.finish_reason = i, a, [1, 2], "stop"
        out.append(s)
    return out


def _slow_reward(slow_s: float) -> Any:
    """A per-sample reward: 1.0 at once, except for a response saying "slow"."""

    async def reward(args: Any, sample: Any) -> dict[str, Any]:
        if "slow" in sample.response:
            await asyncio.sleep(slow_s)
        return {"score": 1.0 if "good" in sample.response else 0.0, "status": "ok"}

    return reward


async def _inline(rewards: InlineRewards, groups: list[list[Sample]]) -> None:
    for g in groups:
        rewards.submit(g)
    await rewards.drain()


async def test_without_a_deadline_every_sample_waits_for_its_reward() -> None:
    group = _group(0, ["good", "bad", "slow good"])
    rewards = InlineRewards(_slow_reward(0.2), None, reward_key="score", concurrency=4)
    await _inline(rewards, [group])
    assert [s.status for s in group] == ["ok", "ok", "ok"]
    assert [s.reward for s in group] == [1.0, 0.0, 1.0]


async def test_a_slow_sample_past_the_deadline_is_judge_timeout_never_zero() -> None:
    group = _group(0, ["good", "bad", "slow good"])
    rewards = InlineRewards(
        _slow_reward(30.0), None, reward_key="score", concurrency=4, deadline_s=0.2
    )
    loop = asyncio.get_running_loop()
    began = loop.time()
    await _inline(rewards, [group])
    assert loop.time() - began < 5
    late = group[2]
    assert late.status == "judge_timeout" and late.reward is None  # never 0
    assert late.left_out == "judge_timeout" and not late.in_loss
    assert "group_judge_deadline_s=0.2" in late.reward_details["error"]
    # the two judged in time train, against a baseline of those two alone
    adv = sample_advantages(group)
    assert [s.in_loss for s in group] == [True, True, False]
    assert group[0].advantage > 0 > group[1].advantage and group[2].advantage == 0.0
    assert adv.num_degenerate_groups == 0
    # counted apart from judge errors: a deadline is no outage and does not stop the run
    assert check_judge_errors(group, 0.0, step=1) == 0


async def test_a_group_left_with_one_scored_response_trains_nothing() -> None:
    thin = _group(0, ["good", "slow a", "slow b"])
    full = _group(1, ["good", "bad"])
    rewards = InlineRewards(
        _slow_reward(30.0), None, reward_key="score", concurrency=4, deadline_s=0.2
    )
    await _inline(rewards, [thin, full])
    assert [s.status for s in thin] == ["ok", "judge_timeout", "judge_timeout"]
    lone = thin[0]
    assert lone.reward == 1.0 and lone.left_out == "no_baseline" and not lone.in_loss
    assert all(s.in_loss for s in full)  # the other group is untouched
    sample_advantages(thin + full)
    assert all(s.advantage == 0.0 for s in thin)
    reason = untrained_reason(thin, 8)
    assert reason is not None and "not judged by --group-judge-deadline-s" in reason
    assert "alone in their group" in reason


async def test_without_a_deadline_a_lone_scored_response_keeps_its_old_rule() -> None:
    group = _group(0, ["good", "x"])
    group[1].apply_reward({"score": None, "status": "judge_error", "error": "down"})
    rewards = InlineRewards(_slow_reward(0.0), None, reward_key="score", concurrency=4)
    await _inline(rewards, [group[:1]])
    assert group[0].in_loss and not group[0].no_baseline  # behaviour unchanged


async def test_a_bug_in_the_reward_still_stops_the_run_under_a_deadline() -> None:
    async def buggy(args: Any, sample: Any) -> dict[str, Any]:
        raise KeyError("a bug, not a judge failure")

    rewards = InlineRewards(buggy, None, reward_key="score", concurrency=2, deadline_s=5.0)
    with pytest.raises(KeyError):
        await _inline(rewards, [_group(0, ["a", "b"])])


# --- a group-level reward: pairwise-genrm ------------------------------------------------------


class PreferLonger:
    """A judge client: "1" (Response A better) when A's quoted response is the longer one."""

    def __init__(self, slow_marker: str | None = None, slow_s: float = 0.0) -> None:
        self.calls = 0
        self.batches = 0
        self.slow_marker, self.slow_s = slow_marker, slow_s

    @staticmethod
    def _verdict(messages: Any) -> str:
        text = messages[-1]["content"]
        a = text.split("<<<BEGIN RESPONSE A>>>")[1].split("<<<END RESPONSE A>>>")[0]
        b = text.split("<<<BEGIN RESPONSE B>>>")[1].split("<<<END RESPONSE B>>>")[0]
        return "1" if len(a) >= len(b) else "0"

    async def generate(self, messages: Any, sampling_params: Any = None, route_key: Any = None,
                       *, prefix_key: Any = None) -> str:  # fmt: skip
        self.calls += 1
        if self.slow_marker and self.slow_marker in messages[-1]["content"]:
            await asyncio.sleep(self.slow_s)
        return self._verdict(messages)

    async def generate_batch(self, requests: list[Any]) -> list[GenerateResponse]:
        self.batches += 1
        self.calls += len(requests)
        return [
            GenerateResponse(response=self._verdict([m.model_dump() for m in r.messages]))
            for r in requests
        ]


def _cfg(tmp_path: Any, **kw: Any) -> Any:
    return build_config(
        hf_checkpoint="m",
        prompt_data="d.jsonl",
        genrm_model_path="scripted",
        genrm_engine="scripted",
        run_dir=str(tmp_path),
        **kw,
    )


async def test_pairwise_inline_scores_each_complete_group_once(tmp_path: Any) -> None:
    judge = PreferLonger()
    setup = reward_setup(_cfg(tmp_path, rm_type="pairwise-genrm"), judge)
    assert setup.inline_fn is None and setup.group_fn is not None and not setup.deferred
    rewards = InlineRewards(
        None, setup.args, reward_key="score", concurrency=1, group_fn=setup.group_fn
    )
    groups = [_group(0, ["a", "aaa", "aa"]), _group(1, ["bb", "b"])]
    await _inline(rewards, groups)
    assert judge.batches == 2  # one generate_batch per group, as each completed
    assert [s.reward for s in groups[0]] == [0.0, 1.0, 0.5]
    assert [s.reward for s in groups[1]] == [1.0, 0.0]
    metrics = pairwise_flips([s for g in groups for s in g], "rollout/")
    assert metrics == {"rollout/pairwise_flip_share": 0.0, "rollout/pairwise_pairs": 4}


async def test_pairwise_inline_under_a_deadline(tmp_path: Any) -> None:
    judge = PreferLonger(slow_marker="| slow", slow_s=30.0)
    cfg = _cfg(tmp_path, rm_type="pairwise-genrm", group_judge_deadline_s=0.3)
    setup = reward_setup(cfg, judge)
    assert setup.deadline_s == 0.3
    rewards = InlineRewards(
        None,
        setup.args,
        reward_key="score",
        concurrency=1,
        group_fn=setup.group_fn,
        deadline_s=setup.deadline_s,
    )
    group = _group(0, ["a", "aaa", "slow"])
    loop = asyncio.get_running_loop()
    began = loop.time()
    await _inline(rewards, [group])
    assert loop.time() - began < 5
    assert [s.status for s in group] == ["ok", "ok", "judge_timeout"]
    assert [s.reward for s in group] == [0.0, 1.0, None]
    assert [s.in_loss for s in group] == [True, True, False]


class _Phases:
    """The part of the phase machine the built-in hook touches (no reward phase)."""

    def __init__(self) -> None:
        self.phases: dict[str, Any] = {}

    def judges(self) -> list[str]:
        return []


async def test_pairwise_in_defer_mode_with_and_without_a_deadline(tmp_path: Any) -> None:
    judge = PreferLonger(slow_marker="| slow", slow_s=30.0)
    for deadline in (None, 0.3):
        cfg = _cfg(
            tmp_path,
            rm_type="dummy",
            defer_reward_to_post_process=True,
            builtin_reward_post_process=True,
            deferred_rm_type="pairwise-genrm",
            group_judge_deadline_s=deadline,
        )
        setup = reward_setup(cfg, judge)
        assert setup.deferred and setup.batch_fn is not None
        batch = _group(0, ["a", "aa"]) + _group(1, ["bbb", "b"] + (["slow"] if deadline else []))
        ctx = PostProcessContext(cfg, _Phases(), setup.batch_fn, "score", setup.deadline_s)  # type: ignore[arg-type]
        await defer_swap_post_process(ctx, batch)
        if deadline is None:
            assert [s.reward for s in batch] == [0.0, 1.0, 1.0, 0.0]
        else:
            assert [s.status for s in batch][:4] == ["ok"] * 4
            assert batch[4].status == "judge_timeout" and batch[4].reward is None
            assert [s.reward for s in batch[:4]] == [0.0, 1.0, 1.0, 0.0]


def test_the_step_metrics_count_timeouts_lone_responses_and_flips() -> None:
    from rl_core.trainer import GRPOTrainer, sample_row

    group = _group(0, ["a", "b", "c"])
    pair = {"both_order_pairs": 2, "flipped_pairs": 1, "comparisons": 4}
    group[0].apply_reward({"score": 0.75, "status": "ok", "details": {"pairwise": pair}})
    group[1].apply_reward({"score": 0.25, "status": "ok", "details": {"pairwise": pair}})
    group[2].apply_reward({"score": None, "status": "judge_timeout", "error": "late"})
    lone = _group(1, ["d", "e"])
    lone[0].apply_reward({"score": 1.0, "status": "ok"})
    lone[1].apply_reward({"score": None, "status": "judge_timeout", "error": "late"})
    from rl_core.group_deadline import leave_lone_out

    assert leave_lone_out(group) == 0 and leave_lone_out(lone) == 1
    m = GRPOTrainer._rollout_metrics(None, group + lone)  # type: ignore[arg-type]
    assert m["rollout/judge_timeouts"] == 2 and m["rollout/no_baseline"] == 1
    assert m["rollout/in_loss"] == 2
    assert m["rollout/pairwise_flip_share"] == 0.5 and m["rollout/pairwise_pairs"] == 2
    row = sample_row(group[2])
    assert (row["status"], row["reward"], row["left_out"]) == (
        "judge_timeout",
        None,
        "judge_timeout",
    )
    assert pairwise_flips(lone, "rollout/") == {}  # another reward's samples: no such metric
