"""Verdict parsing: strict by default, thinking blocks handled, lenient only on request."""

import pytest

from genrm_rewards.verdict import parse_verdict

STRICT = [
    ("1", 1.0, "ok"),
    ("0", 0.0, "ok"),
    (" 1\n", 1.0, "ok"),
    ("\n0  ", 0.0, "ok"),
    ("1.", 0.0, "unparsed"),
    ("Yes", 0.0, "unparsed"),
    ("**1**", 0.0, "unparsed"),
    ("Judgement: 1", 0.0, "unparsed"),
    ("10", 0.0, "unparsed"),
    ("1\n0", 0.0, "unparsed"),
    ("", 0.0, "unparsed"),
    ("<think>the answers match</think>\n1", 1.0, "ok"),
    ("<think>a\n</think> 0 ", 0.0, "ok"),
    ("<think>first</think><think>second</think>1", 1.0, "ok"),
    ("the template opened the block</think>1", 1.0, "ok"),
    ("<think>they match, so the verdict is 1", 0.0, "unparsed"),
    ("<think>1</think>", 0.0, "unparsed"),
    ("1 <think>", 0.0, "unparsed"),
]


@pytest.mark.parametrize(("reply", "score", "status"), STRICT, ids=[repr(c[0]) for c in STRICT])
def test_strict(reply: str, score: float, status: str) -> None:
    verdict = parse_verdict(reply)
    assert (verdict.score, verdict.status) == (score, status)
    assert (verdict.reason is None) == (status == "ok")


def test_truncated_thinking_names_the_reason() -> None:
    verdict = parse_verdict("<think>so far the answers look equal and")
    assert verdict.status == "unparsed"
    assert verdict.reason is not None and "unterminated <think>" in verdict.reason


LENIENT = [
    ("1.", 1.0, "ok"),
    ("Yes", 1.0, "ok"),
    ("no.", 0.0, "ok"),
    ("**1**", 1.0, "ok"),
    ("Judgement: 0", 0.0, "ok"),
    ("Final judgment: **Yes**", 1.0, "ok"),
    ("\\boxed{1}", 1.0, "ok"),
    ("The answers agree.\n1", 1.0, "ok"),
    ("<think>hmm</think>Incorrect", 0.0, "ok"),
    ("maybe", 0.0, "unparsed"),
    ("<think>yes", 0.0, "unparsed"),
]


@pytest.mark.parametrize(("reply", "score", "status"), LENIENT, ids=[repr(c[0]) for c in LENIENT])
def test_lenient(reply: str, score: float, status: str) -> None:
    verdict = parse_verdict(reply, lenient=True)
    assert (verdict.score, verdict.status) == (score, status)
