"""``training.json``: how an adapter was made, written beside it.

An adapter's weights say nothing about its data, seed or schedule; the record does, so a stage
can be rebuilt (``command``) and compared (``held_out_in_script``, ``train_s``) without the
log of its run. The shipped adapter's record is one of these: keep the keys stable.
"""

from __future__ import annotations

import argparse
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch

from genrm_judge_train.adapter import TARGET_MODULES
from genrm_judge_train.steps import StepLog


@dataclass(frozen=True)
class RunFacts:
    """What the run measured and where, beside the flags it was given."""

    layer_ids: list[int]
    cache_s: float
    train_examples: int
    held_out_examples: int
    scores: dict[str, float]
    train_s: float
    total_s: float
    device: str
    autocast: bool


def data_description(ns: argparse.Namespace) -> str:
    """The examples in words: the user's, or the dapo mix with each appended kind's count."""
    if ns.examples:
        return "user examples"
    return (
        f"dapo-math-17k by construction ({ns.train_examples}), plus {ns.format_examples} "
        f"typesetting pairs, {ns.grader_examples} grader-addressed wrong answers and "
        f"{ns.grader_right_examples} right answers with notes to the grader, "
        f"{ns.solution_examples} solution tails, {ns.answer_form_examples} answer forms, "
        f"{ns.contrast_examples} contrast pairs"
    )


def training_record(ns: argparse.Namespace, log: StepLog, facts: RunFacts) -> dict[str, Any]:
    """The ``training.json`` of a run (the key order is the file's)."""
    return {
        "base_model": ns.model,
        "data": data_description(ns),
        "seed": ns.seed,
        "init_adapter": str(ns.init_adapter) if ns.init_adapter else None,
        "steps": log.steps,
        "batch_size": ns.batch_size,
        "lr": ns.lr,
        "rank": ns.rank,
        "alpha": ns.alpha,
        "target_modules": list(TARGET_MODULES),
        "layers_adapted": facts.layer_ids,
        "cache_s": round(facts.cache_s, 1),
        "train_examples": facts.train_examples,
        "held_out_examples": facts.held_out_examples,
        "held_out_in_script": facts.scores,
        "final_loss_last50": sum(log.losses[-50:]) / max(1, len(log.losses[-50:])),
        "skipped_steps": log.skipped,
        "train_s": round(facts.train_s, 1),
        "total_s": round(facts.total_s, 1),
        "device": facts.device,
        "bf16_autocast": facts.autocast,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }
