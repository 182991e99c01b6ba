"""A step's judge calls, from the records each reward left on its samples (``judge_calls``):
how many a sample cost and how long they took, the figures a judge-backed run is watched by."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.sample import Sample

__all__ = ["judge_call_stats", "percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 < q ≤ 100) of ascending ``sorted_values``: a
    value that occurred, so a p99 of few calls is the slowest call, not an interpolation."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def judge_call_stats(samples: Sequence[Sample], prefix: str = "judge/") -> dict[str, Any]:
    """``{prefix}calls`` (new calls; a verdict reused from the cache is none),
    ``{prefix}calls_per_sample``, and latency p50 / p99 over those calls, when there were any."""
    records: list[Mapping[str, Any]] = [
        r
        for s in samples
        for r in s.reward_details.get("judge_calls") or ()
        if isinstance(r, Mapping)
    ]
    made = [r for r in records if r.get("cache") != "hit"]
    stats: dict[str, Any] = {
        f"{prefix}calls": len(made),
        f"{prefix}calls_per_sample": len(made) / len(samples) if samples else 0.0,
    }
    latencies = sorted(float(r["latency_s"]) for r in made if r.get("latency_s") is not None)
    if latencies:
        stats[f"{prefix}latency_p50_s"] = percentile(latencies, 50)
        stats[f"{prefix}latency_p99_s"] = percentile(latencies, 99)
    return stats
