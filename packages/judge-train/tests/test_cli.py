"""The ``genrm-judge-train`` command: its flags, the examples they select, the step schedule.

A run itself needs a model and minutes; these pin what decides its result before the first
step (which examples, in which order, from which seeds) and that the old script is the command.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from genrm_judge_train.answer_forms import ANSWER_FORM_FAMILIES, CONTRAST_FAMILIES
from genrm_judge_train.cli import build_parser
from genrm_judge_train.examples import (
    load_dapo_problems,
    make_examples,
    split_problems,
    write_examples,
)
from genrm_judge_train.format_examples import make_format_examples
from genrm_judge_train.mix import APPENDED, build_examples
from genrm_judge_train.record import data_description

REPO_ROOT = Path(__file__).resolve().parents[3]


def _dapo(tmp_path: Path, n: int = 80) -> Path:
    path = tmp_path / "dapo.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"Compute problem number {i}."}], "label": str(i)}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_console_script_is_the_cli_main() -> None:
    (script,) = entry_points(group="console_scripts", name="genrm-judge-train")
    assert script.value == "genrm_judge_train.cli:main"


def test_the_old_script_prints_the_commands_help(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    monkeypatch.setenv("COLUMNS", "100")
    shown = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts/train_judge.py"), "--help"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    ).stdout
    parser = build_parser()
    parser.prog = "train_judge.py"
    assert shown == parser.format_help()


def test_the_flags_and_their_defaults() -> None:
    ns = build_parser().parse_args(["--out", "x"])
    assert (ns.model, ns.train_examples, ns.held_out_examples, ns.held_out_fraction) == (
        "embedded",
        1600,
        160,
        0.1,
    )
    assert (ns.steps, ns.batch_size, ns.lr, ns.warmup, ns.rank, ns.alpha) == (
        200,
        8,
        5e-4,
        15,
        8,
        16.0,
    )
    assert (ns.top_layers, ns.max_len, ns.bf16, ns.device, ns.no_cut) == (
        9,
        768,
        "auto",
        "auto",
        False,
    )
    assert all(getattr(ns, attr) == 0 for attr, _, _ in APPENDED)
    with pytest.raises(SystemExit):
        build_parser().parse_args([])  # --out is required


def test_every_appended_kind_has_a_flag_and_a_seed_of_its_own() -> None:
    ns = build_parser().parse_args(["--out", "x"])
    assert all(hasattr(ns, attr) for attr, _, _ in APPENDED)
    offsets = [offset for _, offset, _ in APPENDED]
    assert len(set(offsets)) == len(offsets) and not {0, 1} & set(offsets)  # 0, 1: train, held


def test_the_dapo_mix_is_each_kind_from_its_seed_in_order(tmp_path: Path) -> None:
    """The mix the shipped adapter was trained on: changing an order or an offset changes it."""
    flags = ["--dapo", str(_dapo(tmp_path)), "--out", "x", "--seed", "11"]
    flags += ["--train-examples", "30", "--held-out-examples", "6", "--format-examples", "8"]
    flags += ["--grader-examples", "4", "--grader-right-examples", "4"]
    flags += ["--solution-examples", "4", "--answer-form-examples", "8"]
    flags += ["--contrast-examples", "8", "--dump-examples", str(tmp_path / "dump")]
    train, held = build_examples(build_parser().parse_args(flags))
    train_p, held_p = split_problems(load_dapo_problems(tmp_path / "dapo.jsonl"), 0.1)
    want = make_examples(train_p, 30, seed=11)
    want += make_format_examples(train_p, 8, seed=13)
    want += make_examples(train_p, 4, seed=14, grader_probes=True)
    want += make_examples(train_p, 4, seed=15, grader_right=True)
    want += make_examples(train_p, 4, seed=16, solution_tails=True)
    want += make_format_examples(train_p, 8, seed=17, families=ANSWER_FORM_FAMILIES)
    want += make_format_examples(train_p, 8, seed=18, families=CONTRAST_FAMILIES)
    assert train == want
    assert held == make_examples(held_p, 6, seed=12)
    assert not {e.question for e in held} & {p.question for p in train_p}
    dumped = (tmp_path / "dump/train.jsonl").read_text().splitlines()
    assert dumped == [e.to_json() for e in train]


def test_user_examples_are_shuffled_by_the_seed_and_split_by_row(tmp_path: Path) -> None:
    examples = make_examples(
        split_problems(load_dapo_problems(_dapo(tmp_path)), 0.1)[0], 40, seed=0
    )
    write_examples(tmp_path / "mine.jsonl", examples)
    flags = ["--examples", str(tmp_path / "mine.jsonl"), "--out", "x", "--seed", "4"]
    train, held = build_examples(build_parser().parse_args([*flags, "--held-out-fraction", ".25"]))
    shuffled = list(examples)
    random.Random(4).shuffle(shuffled)
    assert (held, train) == (shuffled[:10], shuffled[10:])


@pytest.mark.parametrize("attr", [attr for attr, _, _ in APPENDED])
def test_dapo_only_kinds_are_refused_with_user_examples(tmp_path: Path, attr: str) -> None:
    flag = "--" + attr.replace("_", "-")
    ns = build_parser().parse_args(["--examples", "mine.jsonl", "--out", "x", flag, "3"])
    with pytest.raises(SystemExit, match=f"^{flag} 3: these pairs are built from the dapo"):
        build_examples(ns)


def test_the_record_names_the_data() -> None:
    ns = build_parser().parse_args(["--out", "x", "--format-examples", "5"])
    assert data_description(ns).startswith(
        "dapo-math-17k by construction (1600), plus 5 typesetting pairs, 0 grader-addressed"
    )
    ns = build_parser().parse_args(["--out", "x", "--examples", "mine.jsonl"])
    assert data_description(ns) == "user examples"
