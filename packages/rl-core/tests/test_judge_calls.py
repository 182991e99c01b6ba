"""A step's judge-call figures, from the records the rewards left on its samples."""

from __future__ import annotations

from typing import Any

from rl_core.judge_calls import judge_call_stats, percentile
from rl_core.sample import Sample


def _sample(*calls: dict[str, Any]) -> Sample:
    s = Sample(prompt="p", label="1", metadata={}, group_id=0)
    s.reward_details = {"judge_calls": list(calls)} if calls else {"rule": "equal"}
    return s


def test_calls_per_sample_and_latency_percentiles_count_new_calls_only() -> None:
    batch = [
        _sample({"latency_s": 0.1}, {"latency_s": 0.3}),  # a panel of two
        _sample({"latency_s": 0.2}),
        _sample({"latency_s": 9.0, "cache": "hit"}),  # the verdict of an earlier call, reused
        _sample(),  # the rule gate decided: no call
    ]
    stats = judge_call_stats(batch)
    assert stats["judge/calls"] == 3 and stats["judge/calls_per_sample"] == 0.75
    assert stats["judge/latency_p50_s"] == 0.2 and stats["judge/latency_p99_s"] == 0.3


def test_a_step_without_calls_reports_zero_and_no_latency() -> None:
    stats = judge_call_stats([_sample(), _sample()], prefix="eval/judge/")
    assert stats == {"eval/judge/calls": 0, "eval/judge/calls_per_sample": 0.0}


def test_percentile_is_a_value_that_occurred() -> None:
    values = sorted(float(v) for v in range(1, 101))
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([4.0], 99) == 4.0
