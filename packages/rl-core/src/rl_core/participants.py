"""Participant ids: the names the plan's phase table and the phase machine use for who does what.

``"rollout"``, the trainer roles (``"actor"``, ``"reference"``, ``"actor_fwd"``) and one id per
judge instance, ``genrm:<route_key>``. The judge id is formatted and parsed only here.
"""

from __future__ import annotations

__all__ = ["JUDGE_PREFIX", "is_judge", "judge_id", "judge_key"]

#: What every judge participant id starts with.
JUDGE_PREFIX = "genrm:"


def judge_id(route_key: str) -> str:
    """The participant id of the judge instance ``route_key``."""
    return f"{JUDGE_PREFIX}{route_key}"


def is_judge(who: str) -> bool:
    """Whether ``who`` is a judge instance's participant id."""
    return who.startswith(JUDGE_PREFIX)


def judge_key(who: str) -> str | None:
    """The route key of a judge participant id; ``None`` for any other participant."""
    return who[len(JUDGE_PREFIX) :] if is_judge(who) else None
