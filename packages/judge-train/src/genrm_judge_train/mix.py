"""Which examples a run trains on and which it holds out.

Either the dapo questions (``--dapo``), split by question, turned into examples by construction
and extended with the kinds a flag appends, each from its own seed offset so that adding one
kind leaves every other kind's examples as they were (the fingerprint tests pin the shipped
judge's); or the user's own labelled jsonl (``--examples``), shuffled and split by row.
"""

from __future__ import annotations

import argparse
import logging
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from genrm_judge_train.answer_forms import ANSWER_FORM_FAMILIES, CONTRAST_FAMILIES
from genrm_judge_train.examples import (
    JudgeExample,
    Problem,
    load_dapo_problems,
    make_examples,
    read_examples,
    split_problems,
    write_examples,
)
from genrm_judge_train.format_examples import make_format_examples

logger = logging.getLogger(__name__)

#: Builds ``n`` examples from the training questions with a seed.
Builder = Callable[[list[Problem], int, int], list[JudgeExample]]

#: The kinds appended to the dapo examples, in order: (flag's attribute, seed offset, builder).
#: Offset 0 is the examples by construction, 1 the held-out split.
APPENDED: tuple[tuple[str, int, Builder], ...] = (
    ("format_examples", 2, lambda p, n, s: make_format_examples(p, n, seed=s)),
    ("grader_examples", 3, lambda p, n, s: make_examples(p, n, seed=s, grader_probes=True)),
    ("grader_right_examples", 4, lambda p, n, s: make_examples(p, n, seed=s, grader_right=True)),
    ("solution_examples", 5, lambda p, n, s: make_examples(p, n, seed=s, solution_tails=True)),
    (
        "answer_form_examples",
        6,
        lambda p, n, s: make_format_examples(p, n, seed=s, families=ANSWER_FORM_FAMILIES),
    ),
    (
        "contrast_examples",
        7,
        lambda p, n, s: make_format_examples(p, n, seed=s, families=CONTRAST_FAMILIES),
    ),
)


def default_dapo() -> Path:
    """``<repo>/../shared/data/dapo-math-17k/dapo-math-17k.jsonl`` (the project's data layout;
    this package is a workspace member, never installed outside the repository)."""
    return Path(__file__).resolve().parents[5] / "shared/data/dapo-math-17k/dapo-math-17k.jsonl"


def build_examples(ns: argparse.Namespace) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """The training and held-out examples the flags ask for (written to ``--dump-examples``)."""
    if ns.examples is not None:
        train, held = user_examples(ns)
    else:
        train, held = dapo_examples(ns)
    if ns.dump_examples:
        ns.dump_examples.mkdir(parents=True, exist_ok=True)
        write_examples(ns.dump_examples / "train.jsonl", train)
        write_examples(ns.dump_examples / "held_out.jsonl", held)
    logger.info(
        "examples: %d train (%s), %d held out",
        len(train),
        dict(Counter(e.verdict for e in train)),
        len(held),
    )
    return train, held


def user_examples(ns: argparse.Namespace) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """``--examples``, shuffled by the seed; the first ``--held-out-fraction`` held out."""
    for attr, _, _ in APPENDED:
        n = getattr(ns, attr)
        if n:
            raise SystemExit(
                f"--{attr.replace('_', '-')} {n}: these pairs are built from the dapo questions "
                "(--dapo); with --examples, put them in your jsonl"
            )
    examples = read_examples(ns.examples)
    rng = random.Random(ns.seed)
    rng.shuffle(examples)
    n_held = max(1, int(len(examples) * ns.held_out_fraction))
    return examples[n_held:], examples[:n_held]


def dapo_examples(ns: argparse.Namespace) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """The dapo questions split by question; examples by construction and the appended kinds
    from the training questions, the held-out examples from the others."""
    problems = load_dapo_problems(ns.dapo or default_dapo())
    train_p, held_p = split_problems(problems, ns.held_out_fraction)
    train = make_examples(train_p, ns.train_examples, seed=ns.seed)
    for attr, offset, build in APPENDED:
        train += build(train_p, getattr(ns, attr), ns.seed + offset)
    held = make_examples(held_p, ns.held_out_examples, seed=ns.seed + 1)
    return train, held
