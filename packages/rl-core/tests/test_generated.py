"""The generated data sets: the learning recipe's held-out sums never leak into training."""

import re

from rl_core.config import GENERATED_DATA
from rl_core.generated import GENERATED_SETS, SUMS_EVAL_PAIRS, SUMS_TRAIN_PROMPTS, make_sums

_LINE = re.compile(r"^(\d+) \+ (\d) = (\d+)$")


def _pairs(record):
    """(the open question's pair, the examples' pairs) of one sums-2d1d prompt, checked."""
    *examples, last = record.prompt.split("\n")
    shots = []
    for line in examples:
        a, b, c = map(int, _LINE.match(line).groups())
        assert a + b == c  # every worked example is right
        shots.append((a, b))
    a, b = map(int, last.removesuffix(" =").split(" + "))
    assert record.label == record.metadata["label"] == str(a + b)
    assert record.metadata["question"] == f"What is {a} + {b}?"
    return (a, b), shots


def test_the_held_out_sums_appear_nowhere_in_training():
    train, held_out = make_sums("train"), make_sums("eval")
    assert (len(train), len(held_out)) == (SUMS_TRAIN_PROMPTS, SUMS_EVAL_PAIRS)
    eval_questions = set()
    for r in held_out:
        q, shots = _pairs(r)
        assert 10 <= q[0] <= 99 and 1 <= q[1] <= 9
        assert q not in shots  # an eval prompt never shows its own answer
        eval_questions.add(q)
    assert len(eval_questions) == SUMS_EVAL_PAIRS  # each held-out pair once
    seen_in_training = set()
    for r in train:
        q, shots = _pairs(r)
        seen_in_training.update([q, *shots])
    assert not seen_in_training & eval_questions


def test_generated_sets_are_the_same_on_every_call():
    assert make_sums("train") == make_sums("train")
    assert tuple(GENERATED_SETS) == GENERATED_DATA
    assert {"gen:sums-2d1d", "gen:sums-2d1d-eval"} <= set(GENERATED_SETS)
