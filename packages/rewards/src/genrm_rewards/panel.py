"""Judge panels: one judge question asked of several route keys, the verdicts aggregated.

``judge_panel`` names the members (two or more route keys); every question of a panel-aware
reward (``dapo-genrm``, ``rubric-genrm``: :data:`PANEL_REWARDS`) goes to each of them with the
same messages and prefix key, and ``judge_panel_aggregate`` turns the members' verdicts into
one:

- ``mean``: the mean of the members' scores (soft: 2 of 3 saying 1 is 0.667);
- ``majority``: 1.0 when more than half of the members vote 1, 0.0 when fewer than half do,
  0.5 on a tie (an even panel split in two has no majority either way);
- ``min``: the lowest score (with strict verdicts, 1 only if every member says 1);
- ``unanimity``: 1.0 only when every member votes 1, else 0.0 (with logprob verdicts: every
  member's P("1") ≥ 0.5).

A member's *vote* is its score ≥ 0.5. Failures: without ``judge_panel_quorum`` every member
must answer, and one failed member makes the question a failure (the sample a
``judge_error``, never 0: the other members' verdicts alone are not the panel's). With a
quorum of N, failed members are left out and the rest aggregated as long as N answered; fewer
than N is a failure. A member that answered without a clean verdict (``unparsed``) has voted
0 and makes the aggregate ``unparsed``, as it would alone.

Every decision reports, per pair of members that both answered, whether their votes agreed
(:attr:`PanelDecision.agreement`, ``{"a~b": [agreed, compared]}``), which the trainer sums
into a step metric (rl-core's ``rollout/panel_agreement/a~b``).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Any

from genrm_rewards.args import RewardArgs
from genrm_rewards.judge import JudgeCall, JudgeOutcome
from genrm_rewards.verdict import Verdict

__all__ = [
    "PANEL_REWARDS",
    "Panel",
    "PanelDecision",
    "aggregate_scores",
    "merge_agreement",
    "pair_name",
]

#: The built-in rewards that ask their questions of ``judge_panel`` when it is set.
PANEL_REWARDS = frozenset({"dapo-genrm", "rubric-genrm"})

#: the vote threshold: a member votes 1 when its score is at least this
_VOTE = 0.5


def pair_name(a: str, b: str) -> str:
    """The name of a pair of members in results and metrics: ``"a~b"`` (panel order)."""
    return f"{a}~{b}"


def aggregate_scores(scores: Sequence[float], how: str) -> float:
    """The panel's score from its answering members' scores (see the module docstring)."""
    if not scores:
        raise ValueError("a panel aggregate needs at least one score")
    if how == "mean":
        return statistics.fmean(scores)
    if how == "min":
        return min(scores)
    votes = sum(1 for s in scores if s >= _VOTE)
    if how == "unanimity":
        return 1.0 if votes == len(scores) else 0.0
    if how == "majority":
        if 2 * votes > len(scores):
            return 1.0
        return 0.0 if 2 * votes < len(scores) else 0.5
    raise ValueError(f"unknown panel aggregate {how!r}")


def merge_agreement(parts: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, list[int]]:
    """Sum ``{"a~b": [agreed, compared]}`` counts (a rubric's criteria, a step's samples)."""
    total: dict[str, list[int]] = {}
    for part in parts:
        for pair, (agreed, compared) in part.items():
            counts = total.setdefault(pair, [0, 0])
            counts[0] += int(agreed)
            counts[1] += int(compared)
    return total


@dataclass(frozen=True)
class PanelDecision:
    """A panel's answer to one question.

    ``outcome`` is the aggregate as one judge outcome (failed when the failure rule says so);
    ``members`` each member's own verdict (route key → score, status, pred or error);
    ``agreement`` the pairs' vote agreement on this question.
    """

    outcome: JudgeOutcome
    members: dict[str, dict[str, Any]]
    agreement: dict[str, list[int]]

    def report(self) -> dict[str, Any]:
        """What a result's ``details["panel"]`` says about this question."""
        return {"members": self.members, "agreement": self.agreement}


@dataclass(frozen=True)
class Panel:
    """The run's panel: ``judge_panel``, ``judge_panel_aggregate``, ``judge_panel_quorum``."""

    members: tuple[str, ...]
    aggregate: str
    quorum: int | None

    @classmethod
    def of(cls, settings: RewardArgs) -> Panel | None:
        """The panel ``settings`` ask for, or ``None`` (one judge: ``genrm_route_key``)."""
        if not settings.judge_panel:
            return None
        return cls(
            settings.judge_panel, settings.judge_panel_aggregate, settings.judge_panel_quorum
        )

    @property
    def rule(self) -> str:
        """The failure rule in words (results' ``details["panel"]["rule"]``)."""
        if self.quorum is None:
            return "every member must answer (no quorum): a failed member fails the question"
        return f"failed members are left out while at least {self.quorum} answered (quorum)"

    def describe(self) -> dict[str, Any]:
        """The panel as a result reports it, beside the per-question parts."""
        return {
            "members": list(self.members),
            "aggregate": self.aggregate,
            "quorum": self.quorum,
            "rule": self.rule,
        }

    def calls(self, call: JudgeCall) -> list[JudgeCall]:
        """``call`` once per member: the same messages and prefix key, the member's route."""
        return [replace(call, route_key=member) for member in self.members]

    def decide(self, outcomes: Sequence[JudgeOutcome]) -> PanelDecision:
        """Aggregate the members' outcomes (in :attr:`members` order) by the panel's rules."""
        if len(outcomes) != len(self.members):
            raise ValueError(f"{len(outcomes)} outcomes for a panel of {len(self.members)}")
        members: dict[str, dict[str, Any]] = {}
        answered: list[tuple[str, Verdict]] = []
        failed: list[tuple[str, str]] = []
        for member, outcome in zip(self.members, outcomes, strict=True):
            if outcome.verdict is None:
                error = outcome.error or "judge call failed"
                failed.append((member, error))
                members[member] = {"score": None, "status": "judge_error", "error": error}
            else:
                answered.append((member, outcome.verdict))
                members[member] = {
                    "score": outcome.verdict.score,
                    "status": outcome.verdict.status,
                    "pred": outcome.verdict.pred,
                }
        agreement: dict[str, list[int]] = {}
        votes = {m: v.score >= _VOTE for m, v in answered}
        for a, b in combinations(self.members, 2):
            if a in votes and b in votes:
                agreement[pair_name(a, b)] = [int(votes[a] == votes[b]), 1]
        needed = len(self.members) if self.quorum is None else self.quorum
        if failed and len(answered) < needed:
            errors = "; ".join(f"{m}: {e}" for m, e in failed)
            rule = "no quorum" if self.quorum is None else f"quorum {self.quorum}"
            error = (
                f"judge panel: {len(answered)} of {len(self.members)} members answered "
                f"({rule}); {errors}"
            )
            return PanelDecision(JudgeOutcome(None, error, None), members, agreement)
        score = aggregate_scores([v.score for _, v in answered], self.aggregate)
        clean = all(v.status == "ok" for _, v in answered)
        pred = " ".join(f"{m}={v.pred!r}" for m, v in answered)
        verdict = Verdict(
            score,
            "ok" if clean else "unparsed",
            pred,
            None if clean else "a panel member's reply is not a clean verdict",
        )
        return PanelDecision(JudgeOutcome(verdict, None, None), members, agreement)
