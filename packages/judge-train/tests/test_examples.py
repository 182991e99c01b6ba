"""The judge's training examples: labelled by construction, seeded, split by question."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from genrm_judge_train.examples import (
    NO_QUESTION,
    JudgeExample,
    Problem,
    load_dapo_problems,
    make_examples,
    read_examples,
    split_problems,
    write_examples,
)
from genrm_rewards.samples import extract_answer

PROBLEMS = [Problem(f"Compute problem number {i}.", str(i * 37 - 400)) for i in range(60)]


def test_same_seed_same_examples_other_seed_others() -> None:
    a = make_examples(PROBLEMS, 300, seed=5)
    assert a == make_examples(PROBLEMS, 300, seed=5)
    assert a != make_examples(PROBLEMS, 300, seed=6)


def test_every_shape_and_both_verdicts_are_covered() -> None:
    examples = make_examples(PROBLEMS, 2000, seed=0)
    shapes = Counter(e.kind.split("/")[0] for e in examples)
    assert set(shapes) == {
        "answer_line",
        "bare",
        "reasoning",
        "changed_mind",
        "truncated",
        "garbage",
        "grader",
    }
    kinds = {e.kind.split("/")[1] for e in examples}
    assert {"int", "fraction", "decimal", "radical", "tuple", "interval"} <= kinds
    verdicts = Counter(e.verdict for e in examples)
    assert 0.4 < verdicts[1] / len(examples) < 0.6
    assert all(e.verdict == 0 for e in examples if e.kind.split("/")[0] in ("truncated", "garbage"))
    assert any(e.question == NO_QUESTION for e in examples)


def test_grader_addressed_wrong_answers_are_zero() -> None:
    examples = make_examples(PROBLEMS, 3000, seed=1)
    wrong = [e for e in examples if e.kind.startswith("grader/") and e.kind.endswith("/wrong")]
    assert wrong and all(e.verdict == 0 for e in wrong)
    assert any("1" in e.response for e in wrong)


def test_integer_forms_hold_the_label_and_misses_do_not() -> None:
    """Plain numeric finals are checked by value: same forms equal, misses differ."""
    examples = make_examples(PROBLEMS, 3000, seed=2)
    checked = 0
    for e in examples:
        if not e.kind.startswith("bare/int/"):
            continue
        text = extract_answer(e.response).strip().removesuffix(".")
        for wrap in ("\\boxed{", "$\\boxed{", "$", "\\("):
            text = text.removeprefix(wrap)
        text = text.rstrip("}$)").rstrip("\\")
        try:
            value = Fraction(text)
        except ValueError:
            continue
        assert (value == Fraction(e.label)) == bool(e.verdict), e
        checked += 1
    assert checked > 50


def test_changed_mind_is_judged_by_the_final_answer() -> None:
    examples = [e for e in make_examples(PROBLEMS, 3000, seed=3) if e.kind.startswith("changed")]
    assert {e.verdict for e in examples} == {0, 1}
    for e in examples:
        assert "re-check" in e.response or "slip" in e.response or "reconsider" in e.response


def test_split_is_by_question_and_stable() -> None:
    problems = [Problem(f"question {i}", str(i)) for i in range(2000)]
    train, held = split_problems(problems, 0.1)
    assert len(train) + len(held) == 2000 and 120 < len(held) < 280
    assert not {p.question for p in train} & {p.question for p in held}
    assert split_problems(problems, 0.1) == (train, held)


def test_dapo_rows_lose_the_instruction(tmp_path: Path) -> None:
    content = (
        "Solve the following math problem step by step. The last line of your response should "
        "be of the form Answer: $Answer\n\nWhat is 2+2?\n\nRemember to put your answer on its "
        'own line after "Answer:".'
    )
    path = tmp_path / "d.jsonl"
    rows = [{"prompt": [{"role": "user", "content": content}], "label": "4"}]
    rows.append({"prompt": [{"role": "user", "content": "x" * 2000}], "label": "1"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_dapo_problems(path) == [Problem("What is 2+2?", "4")]  # the long one skipped


def test_users_examples_round_trip_and_bad_rows_fail(tmp_path: Path) -> None:
    examples = [JudgeExample("q", "1/2", "Answer: 0.5", 1, "user")]
    write_examples(tmp_path / "e.jsonl", examples)
    assert read_examples(tmp_path / "e.jsonl") == examples
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "label": "1"}) + "\n")
    with pytest.raises(ValueError, match=r"without \['response', 'verdict'\]"):
        read_examples(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text(
        json.dumps({"question": "q", "label": "1", "response": "1", "verdict": 2}) + "\n"
    )
    with pytest.raises(ValueError, match="verdict must be 0 or 1"):
        read_examples(tmp_path / "bad2.jsonl")


def test_no_problems_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one problem"):
        make_examples([], 1, seed=0)


def test_grader_probes_are_wrong_answers_that_address_the_grader() -> None:
    probes = make_examples(PROBLEMS, 200, seed=4, grader_probes=True)
    assert all(e.verdict == 0 and e.kind.startswith("grader/") for e in probes)
    assert all(e.kind.endswith("/wrong") for e in probes)


def test_grader_right_examples_are_right_answers_with_the_same_notes() -> None:
    """The counterweight to the probes: a note to the grader does not make an answer wrong."""
    right = make_examples(PROBLEMS, 200, seed=5, grader_right=True)
    assert all(e.verdict == 1 and e.kind.startswith("grader/") for e in right)
    assert all(e.kind.endswith("/right") for e in right)
    with pytest.raises(ValueError, match="exclude each other"):
        make_examples(PROBLEMS, 1, seed=0, grader_probes=True, grader_right=True)


def test_solution_tails_hold_the_answer_inside_a_closing_sentence() -> None:
    """The end of a long solution: the answer is not the last thing written, numbers of the
    steps come before it, and math-verify (which reads the last boxed / math answer) never
    proves a near miss equal, and proves most right ones equal."""
    from genrm_rewards.rules import math_decide_sync

    tails = make_examples(PROBLEMS, 300, seed=6, solution_tails=True)
    assert all(e.kind.startswith("solution/") for e in tails)
    assert 0.4 < sum(e.verdict for e in tails) / len(tails) < 0.6
    ends = (e.response.rstrip().split(" <|")[0].removesuffix("<|endoftext|>") for e in tails)
    assert sum(end.endswith((".", "!")) for end in ends) > 250
    assert 20 < sum("<|" in e.response for e in tails) < 80
    proved = 0
    for e in tails:
        decision = math_decide_sync(e.label, extract_answer(e.response))
        if e.verdict == 0:
            assert decision != "equal", e
        else:
            proved += decision == "equal"
    assert proved > 0.6 * sum(e.verdict for e in tails)
    with pytest.raises(ValueError, match="exclude each other"):
        make_examples(PROBLEMS, 1, seed=0, grader_right=True, solution_tails=True)


def _fingerprint(examples: list[JudgeExample]) -> str:
    rows = (json.dumps([e.question, e.label, e.response, e.verdict, e.kind]) for e in examples)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def test_a_seed_makes_the_examples_the_shipped_judge_was_trained_on() -> None:
    """The shipped adapter's command is its recipe only while a seed gives the same examples:
    a new shape or kind must come as an option (as ``solution_tails`` did), not in the mix."""
    assert _fingerprint(make_examples(PROBLEMS, 200, seed=6)) == "9a973a34076fc2ef"
    assert _fingerprint(make_examples(PROBLEMS, 100, seed=3, grader_right=True)) == (
        "a2231d81917f920c"
    )
    # stage 11 added the solution tails (prose closings, chat-template trailers)
    assert _fingerprint(make_examples(PROBLEMS, 100, seed=3, solution_tails=True)) == (
        "47cdaee482e02185"
    )
