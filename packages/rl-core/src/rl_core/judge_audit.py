"""Where a sample's reward came from, and how often the judge agrees with math-verify on the
samples where math-verify has a view.

With ``--rule-audit`` every dapo-genrm result carries ``rule``: what math-verify says about the
answer (``equal`` / ``not_equal``, or ``undecided`` where it cannot parse a side). A judge that
rewards " 1EPOCH" for "12" disagrees with a decided ``not_equal`` and shows up here, step by
step, instead of hiding inside a reward mean. A judge reply without a clean verdict counts as a
disagreement: it gave no judgement where one was possible.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_core.sample import Sample

__all__ = ["rule_agreement", "verdict_source"]

#: where a sample's reward came from (:func:`verdict_source`) when the judge decided it
JUDGED = ("judge", "judge_cache", "judge_unparsed")


def verdict_source(sample: Sample) -> str:
    """Where a sample's reward came from: rule gate, judge, cache, or an error / other rule."""
    d = sample.reward_details
    if sample.status in ("judge_error", "aborted"):
        return sample.status
    if d.get("gate") == "hit":
        return "gate"
    if d.get("cache") == "hit":
        return "judge_cache"
    if sample.status == "unparsed":
        return "judge_unparsed"
    if "gate" in d or "route_key" in d:
        return "judge"
    return "rule"


def rule_agreement(
    samples: Sequence[Sample], sources: Sequence[str], prefix: str
) -> dict[str, Any]:
    """``{prefix}judge_rule_agreement`` (None when nothing was comparable) and
    ``{prefix}judge_rule_compared``, over judged samples that math-verify decided."""
    agree = compared = 0
    for sample, source in zip(samples, sources, strict=True):
        rule = sample.reward_details.get("rule")
        if source not in JUDGED or rule not in ("equal", "not_equal"):
            continue
        compared += 1
        if source != "judge_unparsed" and sample.reward is not None:
            agree += int((sample.reward >= 0.5) == (rule == "equal"))
    return {
        f"{prefix}judge_rule_agreement": agree / compared if compared else None,
        f"{prefix}judge_rule_compared": compared,
    }
