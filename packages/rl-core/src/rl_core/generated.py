"""The data sets that ``--prompt-data gen:NAME`` generates instead of reading a file.

Two families, both few-shot bare equations that the embedded Gemma 3 270M *base* model partly
solves, so a GRPO group of its answers holds right and wrong ones:

- ``easy-math``: one-digit sums and differences, the demo's set (the base model gets about 70 %
  right at temperature 1: enough to show the machinery, too easy to show learning);
- ``sums-2d1d``: a two-digit number plus a one-digit one (``47 + 8``), the learning recipe's set.
  Its greedy held-out pass@1 for the base model is about 0.35 (0.33 on 64 questions, 0.39 on
  128), inside the 0.15-0.50 band where a reward has room to teach and signal to teach with.
  The 810 pairs (a in 10..99, b in 1..9) are shuffled once with a fixed seed; the first 200 are
  held out for evaluation, and every training prompt, question and examples alike, is drawn
  from the other 610, so the eval set measures generalisation to unseen sums, not recall.

Every set is deterministic: a run's ``RUN_DIR/data/`` copy is the same file on every machine.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from rl_core.data import PromptRecord, make_easy_math

#: How the 2-digit + 1-digit pairs are split, and how many prompts each side gets.
SUMS_SPLIT_SEED = 2026
SUMS_EVAL_PAIRS = 200
SUMS_TRAIN_PROMPTS = 4000
SUMS_SHOTS = 4


def _sum_pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train pairs, held-out pairs): disjoint, fixed by :data:`SUMS_SPLIT_SEED`."""
    pairs = [(a, b) for a in range(10, 100) for b in range(1, 10)]
    random.Random(SUMS_SPLIT_SEED).shuffle(pairs)
    return pairs[SUMS_EVAL_PAIRS:], pairs[:SUMS_EVAL_PAIRS]


def _sum_record(
    question: tuple[int, int], shots: list[tuple[int, int]], ident: str
) -> PromptRecord:
    lines = "".join(f"{a} + {b} = {a + b}\n" for a, b in shots)
    a, b = question
    return PromptRecord(
        prompt=f"{lines}{a} + {b} =",
        label=str(a + b),
        metadata={"question": f"What is {a} + {b}?", "label": str(a + b), "id": ident},
    )


def make_sums(split: Literal["train", "eval"], *, shots: int = SUMS_SHOTS) -> list[PromptRecord]:
    """The ``sums-2d1d`` set: ``SUMS_TRAIN_PROMPTS`` training prompts, or one eval prompt per
    held-out pair. The examples of every prompt come from the training pairs, never the
    question itself, so an eval prompt shows nothing of its own answer."""
    train, held_out = _sum_pairs()
    rng = random.Random(f"sums-2d1d-{split}")
    if split == "eval":
        questions = held_out
    else:
        questions = [rng.choice(train) for _ in range(SUMS_TRAIN_PROMPTS)]
    records = []
    for i, q in enumerate(questions):
        examples = rng.sample([p for p in train if p != q], shots)
        records.append(_sum_record(q, examples, f"sums-2d1d-{split}-{i}"))
    return records


#: ``--prompt-data`` / ``--eval-prompt-data`` names, each with what it generates.
GENERATED_SETS: dict[str, Callable[[], list[PromptRecord]]] = {
    "gen:easy-math": lambda: make_easy_math(256, seed=11),
    "gen:easy-math-eval": lambda: make_easy_math(64, seed=977),
    "gen:sums-2d1d": lambda: make_sums("train"),
    "gen:sums-2d1d-eval": lambda: make_sums("eval"),
}
