"""Where a sample's reward came from, and how often the judge agrees with math-verify on the
samples where math-verify has a view.

With ``--rule-audit`` every dapo-genrm result carries ``rule``: what math-verify says about the
answer (``equal`` / ``not_equal``, or ``undecided`` where it cannot parse a side). A judge that
rewards " 1EPOCH" for "12" disagrees with a decided ``not_equal`` and shows up here, step by
step, instead of hiding inside a reward mean. A judge reply without a clean verdict counts as a
disagreement: it gave no judgement where one was possible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from rl_core.sample import Sample

#: how long math-verify may take over one evaluation answer before it counts as undecided
VERIFY_TIMEOUT_S = 5.0

__all__ = [
    "disagrees_with_rule",
    "panel_agreement",
    "rule_agreement",
    "verdict_source",
    "verified_pass1",
]

#: where a sample's reward came from (:func:`verdict_source`) when the judge decided it
JUDGED = ("judge", "judge_cache", "judge_unparsed")


def verdict_source(sample: Sample) -> str:
    """Where a sample's reward came from: rule gate, judge, cache, or an error / other rule."""
    d = sample.reward_details
    if sample.status in ("judge_error", "aborted", "judge_timeout"):
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


def panel_agreement(samples: Sequence[Sample], prefix: str) -> dict[str, Any]:
    """How often the members of a judge panel (``--judge-panel``) agreed, per pair of members:
    ``{prefix}panel_agreement/a~b`` (the share of the questions both answered on which their
    votes were the same) and ``{prefix}panel_compared/a~b`` (how many questions that is), over
    the step's results that report ``details["panel"]["agreement"]`` (a rubric's criteria are
    a question each). Empty without a panel."""
    counts: dict[str, list[int]] = {}
    for sample in samples:
        details = sample.reward_details.get("details")
        panel = details.get("panel") if isinstance(details, dict) else None
        agreement = panel.get("agreement") if isinstance(panel, dict) else None
        if not isinstance(agreement, dict):
            continue
        for pair, (agreed, compared) in agreement.items():
            total = counts.setdefault(str(pair), [0, 0])
            total[0] += int(agreed)
            total[1] += int(compared)
    metrics: dict[str, Any] = {}
    for pair, (agreed, compared) in sorted(counts.items()):
        metrics[f"{prefix}panel_agreement/{pair}"] = agreed / compared if compared else None
        metrics[f"{prefix}panel_compared/{pair}"] = compared
    return metrics


def disagrees_with_rule(source: str, reward: float | None, rule: Any) -> bool | None:
    """Whether a judged verdict disagrees with math-verify's decided view of the answer (a
    reply without a clean verdict does); None where they are not comparable (not judged, or
    math-verify undecided). The one rule of :func:`rule_agreement` and ``rl-core show``."""
    if source not in JUDGED or rule not in ("equal", "not_equal"):
        return None
    if source == "judge_unparsed" or reward is None:
        return True
    return bool((reward >= 0.5) != (rule == "equal"))


def rule_agreement(
    samples: Sequence[Sample], sources: Sequence[str], prefix: str
) -> dict[str, Any]:
    """``{prefix}judge_rule_agreement`` (None when nothing was comparable) and
    ``{prefix}judge_rule_compared``, over judged samples that math-verify decided."""
    agree = compared = 0
    for sample, source in zip(samples, sources, strict=True):
        differs = disagrees_with_rule(source, sample.reward, sample.reward_details.get("rule"))
        if differs is None:
            continue
        compared += 1
        agree += int(not differs)
    return {
        f"{prefix}judge_rule_agreement": agree / compared if compared else None,
        f"{prefix}judge_rule_compared": compared,
    }


async def verified_pass1(samples: Sequence[Sample], prefix: str) -> dict[str, Any]:
    """``{prefix}verified_accuracy``: pass@1 by math-verify alone, whatever the run's reward.

    A run's own accuracy is its reward's verdict: the judge's for a judge run, a coin's for a
    null control. Runs with different rewards are only comparable on one referee, so every
    evaluation answer is also checked against its label by math-verify (the ``rule`` the audit
    already recorded, else a fresh check). Undecided or timed-out checks count as wrong: an
    answer math-verify cannot read is not a right one. Samples are averaged per prompt first.
    """
    from genrm_rewards.errors import RewardInputError
    from genrm_rewards.rules import math_decide
    from genrm_rewards.samples import extract_answer, label_of, response_of

    async def verdict(s: Sample, label: str) -> str:
        rule = s.reward_details.get("rule")
        if rule in ("equal", "not_equal", "undecided"):
            return str(rule)
        answer = extract_answer(response_of(s))
        return await math_decide(label, answer, timeout_s=VERIFY_TIMEOUT_S)

    checked: list[tuple[Sample, str]] = []
    for s in samples:
        if s.status == "aborted":  # never answered: nothing to verify, as in the loss
            continue
        try:
            checked.append((s, label_of(s)))
        except RewardInputError:  # a question without a reference has nothing to verify
            continue
    # concurrently: math-verify's own bounded pool sets the pace, not one answer at a time
    rules = await asyncio.gather(*(verdict(s, label) for s, label in checked))
    per_prompt: dict[int, list[float]] = {}
    for (s, _), rule in zip(checked, rules, strict=True):
        per_prompt.setdefault(s.group_id, []).append(float(rule == "equal"))
    means = [sum(v) / len(v) for v in per_prompt.values()]
    return {
        f"{prefix}verified_accuracy": sum(means) / len(means) if means else None,
        # a check that overran counts as wrong above; counted here so that is never silent
        f"{prefix}verified_timeouts": sum(1 for rule in rules if rule == "timeout"),
    }
