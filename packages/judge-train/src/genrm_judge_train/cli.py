"""Fine-tune a judge: a LoRA adapter that makes a causal LM answer the dapo-genrm prompt with 1 / 0.

This is how the embedded judge (``genrm_serve/adapters/gemma3-270m-judge``) was made, and how a
user makes one for their own data: ``genrm-judge-train`` (``python scripts/train_judge.py`` is
the same command).

What is trained: the prompt is rendered and tokenised exactly as the hf engine does it
(:mod:`genrm_judge_train.encoding`), and the loss is the cross-entropy of the verdict token
("1" or "0") after the prompt plus that of the end-of-text token after the verdict, at those
two positions only (:mod:`genrm_judge_train.steps`). LoRA on every attention and MLP
projection; the base stays frozen (on a CPU its bottom layers run once, :mod:`.cut_model`).

Data: ``--dapo`` (questions and integer labels of dapo-math-17k) turned into labelled examples by
construction (:mod:`genrm_judge_train.examples`), or ``--examples`` (your own jsonl of
``{"question", "label", "response", "verdict"}``). A held-out split (questions never trained on)
is scored at the end; ``benchmarks/judge_agreement.py`` measures through the real engine.

    # the shipped adapter (stage 11, seeded; 338 s of training on one H100)
    genrm-judge-train --device cuda --no-cut --top-layers 18 --rank 16 --alpha 32 \\
        --held-out-examples 400 --batch-size 64 --warmup 50 --steps 1150 --seed 11 \\
        --train-examples 30000 --format-examples 14000 --grader-examples 4000 \\
        --grader-right-examples 1000 --solution-examples 8000 --answer-form-examples 12000 \\
        --lr 3e-4 --out packages/genrm-serve/src/genrm_serve/adapters/gemma3-270m-judge
    # your own data, your own base model folder
    genrm-judge-train --examples my_pairs.jsonl --model /path/to/model --out my-judge

Importing this module imports no torch: ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="base model folder, or 'embedded'")
    ap.add_argument("--dapo", type=Path, default=None, help="DAPO-style jsonl (default: shared)")
    ap.add_argument("--examples", type=Path, default=None, help="your own labelled jsonl")
    ap.add_argument("--out", type=Path, required=True, help="adapter folder to write")
    ap.add_argument("--seed", type=int, default=0)
    _data_flags(ap)
    _training_flags(ap)
    _runtime_flags(ap)
    return ap


def _data_flags(ap: argparse.ArgumentParser) -> None:
    """How many examples of each kind (``genrm_judge_train.mix``)."""
    ap.add_argument("--train-examples", type=int, default=1600)
    ap.add_argument("--held-out-examples", type=int, default=160)
    appended = (
        (
            "--format-examples",
            "typesetting pairs appended to the training examples "
            "(genrm_judge_train.format_examples)",
        ),
        (
            "--grader-examples",
            "wrong answers that address the grader ('Judgement: 1', ...), appended",
        ),
        (
            "--grader-right-examples",
            "right answers followed by the same notes to the grader, appended",
        ),
        (
            "--solution-examples",
            "answers inside the closing sentence of a long LaTeX solution, appended",
        ),
        (
            "--answer-form-examples",
            "one value stated in another form (x = 5 for 5, a chain, an interval), appended",
        ),
        (
            "--contrast-examples",
            "0.5 for 1/2 against 0.33 for 1/3, an equation label against its right side, "
            "grouped thousands against a list (answer_forms.CONTRAST_FAMILIES), appended",
        ),
    )
    for flag, help_text in appended:
        ap.add_argument(flag, type=int, default=0, help=help_text)
    ap.add_argument("--held-out-fraction", type=float, default=0.1)


def _training_flags(ap: argparse.ArgumentParser) -> None:
    """The schedule and the adapter's shape (``genrm_judge_train.steps``, ``.adapter``)."""
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument(
        "--top-layers",
        type=int,
        default=9,
        help="LoRA on the top N decoder layers; the layers below run once per example",
    )
    ap.add_argument("--max-len", type=int, default=768, help="prompt tokens kept (the tail)")


def _runtime_flags(ap: argparse.ArgumentParser) -> None:
    """Where and how long it runs, and what it keeps (``genrm_judge_train.pipeline``)."""
    ap.add_argument("--bf16", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the cores)")
    ap.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when a GPU is present",
    )
    ap.add_argument(
        "--no-cut",
        action="store_true",
        help="run the whole model every step, no cache of the frozen layers (always on a GPU)",
    )
    ap.add_argument("--max-train-s", type=float, default=0, help="stop the steps after this")
    ap.add_argument(
        "--stop-after",
        type=int,
        default=0,
        help="stop after this many steps of the --steps schedule (replays a timed-out run)",
    )
    ap.add_argument(
        "--cache-file",
        type=Path,
        default=None,
        help="keep the frozen layers' states here (reused by a run on the same examples)",
    )
    ap.add_argument(
        "--init-adapter", type=Path, default=None, help="continue from an adapter of this script"
    )
    ap.add_argument("--dump-examples", type=Path, default=None, help="write the examples here")


def main(argv: Sequence[str] | None = None) -> None:
    """``genrm-judge-train``: parse the flags, then train and write the adapter."""
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from genrm_judge_train.pipeline import train

    train(ns)


if __name__ == "__main__":
    main()
