"""Turning a judge's reply into a verdict, strictly by default.

The original dapo-genrm scores 1.0 only when the stripped reply is exactly ``"1"`` and 0.0 for
anything else, so a judge that answers ``"1."`` or ``"Yes"`` or thinks out loud silently zeroes a
whole run. We keep the strict rule for what counts as a verdict but separate the outcomes:
``"1"`` / ``"0"`` are ``"ok"``; anything else is ``"unparsed"`` (still 0.0, but counted). A
complete ``<think>…</think>`` block before the verdict is dropped first; an unterminated one is a
judge cut off mid-thought, which is ``"unparsed"`` rather than a 0 by accident. Lenient parsing
(``"1."``, ``"**Yes**"``, ``"Judgement: 0"``, ``\\boxed{1}``) is an explicit option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["Verdict", "parse_verdict", "strip_thinking"]

_PRED_MAX_CHARS = 200
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_LENIENT_PREFIX = re.compile(
    r"^(?:final\s+)?(?:judge?ment|verdict|answer|score|result|output)\s*[:：=]\s*", re.IGNORECASE
)
_BOXED = re.compile(r"^\\boxed\{(.*)\}$")
_LENIENT_MAP = {
    "1": 1.0,
    "yes": 1.0,
    "true": 1.0,
    "consistent": 1.0,
    "correct": 1.0,
    "0": 0.0,
    "no": 0.0,
    "false": 0.0,
    "inconsistent": 0.0,
    "incorrect": 0.0,
}


@dataclass(frozen=True)
class Verdict:
    """A parsed judge reply: ``score`` is 1.0 or 0.0; ``status`` says whether it was clean."""

    score: float
    status: Literal["ok", "unparsed"]
    #: the reply without its thinking block, stripped and capped (what the result's ``pred`` is)
    pred: str
    #: why the reply was not a clean verdict (``None`` when ``status == "ok"``)
    reason: str | None = None


def strip_thinking(text: str) -> tuple[str, bool]:
    """Drop a thinking block before the verdict; return ``(rest, complete)``.

    ``complete`` is ``False`` when a ``<think>`` is never closed (a truncated thinking judge).
    A lone ``</think>`` (the chat template opened the block in the prompt) also ends thinking.
    """
    open_at = text.find(_THINK_OPEN)
    close_at = text.rfind(_THINK_CLOSE)
    if open_at >= 0 and close_at < open_at:
        return "", False
    if close_at >= 0:
        return text[close_at + len(_THINK_CLOSE) :], True
    return text, True


def _lenient_token(body: str) -> str:
    lines = [ln for ln in body.splitlines() if ln.strip()]
    token = lines[-1].strip() if lines else ""
    token = token.strip("*_`\"' \t")
    token = _LENIENT_PREFIX.sub("", token).strip("*_`\"' \t")
    boxed = _BOXED.match(token)
    if boxed:
        token = boxed.group(1).strip()
    return token.rstrip(".!。").strip().lower()


def parse_verdict(text: str, *, lenient: bool = False) -> Verdict:
    """Parse a judge reply into a ``Verdict``.

    Strict (default): after removing a complete thinking block, the stripped reply must be
    exactly ``"1"`` (score 1.0) or ``"0"`` (score 0.0); anything else is ``"unparsed"`` with
    score 0.0. Lenient: the last non-empty line, without markdown, a ``Judgement:``-style
    prefix, ``\\boxed{}`` and a trailing period, may also be yes/no/true/false/(in)correct.
    """
    body, complete = strip_thinking(text)
    pred = body.strip()[:_PRED_MAX_CHARS]
    if not complete:
        return Verdict(0.0, "unparsed", pred, "unterminated <think> block (judge cut off?)")
    stripped = body.strip()
    if stripped == "1":
        return Verdict(1.0, "ok", pred)
    if stripped == "0":
        return Verdict(0.0, "ok", pred)
    if lenient:
        score = _LENIENT_MAP.get(_lenient_token(stripped))
        if score is not None:
            return Verdict(score, "ok", pred)
    if not stripped:
        return Verdict(0.0, "unparsed", pred, "empty reply")
    return Verdict(0.0, "unparsed", pred, f"reply is not exactly '1' or '0': {pred[:60]!r}")
