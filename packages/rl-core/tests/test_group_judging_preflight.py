"""The pairwise and deadline options are refused before Ray starts when they cannot work:
each message names the flag, the value and the rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rl_core.config import ConfigError, parse_train_args
from rl_core.preflight import check_group_judging

JUDGE = json.dumps({"__default__": {"model_path": "scripted:1", "num_gpus": 1}})
BASE = [
    "--hf-checkpoint",
    "m",
    "--prompt-data",
    "d.jsonl",
    "--genrm-instances",
    JUDGE,
    "--rm-type",
    "pairwise-genrm",
    "--n-samples-per-prompt",
    "8",
    "--rollout-batch-size",
    "2",
]

CASES = {
    "rounds below 1": (["--pairwise-rounds", "0"], r"--pairwise-rounds = 0: .*greater than"),
    "min comparisons below 1": (
        ["--pairwise-min-comparisons", "0"],
        r"--pairwise-min-comparisons = 0: .*greater than",
    ),
    "a deadline of 0 s": (["--group-judge-deadline-s", "0"], r"--group-judge-deadline-s = 0"),
    "a negative deadline": (["--group-judge-deadline-s", "-3"], r"--group-judge-deadline-s = -3"),
    "more rounds than a round robin has": (
        ["--pairwise-pairing", "round-robin", "--pairwise-rounds", "8"],
        r"--pairwise-rounds 8: a round robin of --n-samples-per-prompt 8 has 7 rounds",
    ),
    "more comparisons asked than the pairing gives": (
        ["--pairwise-pairing", "round-robin", "--pairwise-min-comparisons", "5"],
        r"--pairwise-min-comparisons 5: with --pairwise-pairing round-robin --pairwise-rounds 2 "
        r"and --n-samples-per-prompt 8, some response is asked in only 4 comparison\(s\)",
    ),
    "one order only halves them": (
        ["--no-pairwise-both-orders", "--pairwise-min-comparisons", "8"],
        r"--pairwise-min-comparisons 8: with --pairwise-pairing all --no-pairwise-both-orders "
        r"and --n-samples-per-prompt 8, some response is asked in only 7",
    ),
    "an evaluation group of one": (
        ["--eval-prompt-data", "e.jsonl", "--n-samples-per-eval-prompt", "1"],
        r"--n-samples-per-eval-prompt 1: --rm-type pairwise-genrm compares the responses of a "
        r"group, and a group of 1 has none",
    ),
    "pairwise in defer mode, checked the same": (
        [
            "--rm-type",
            "dummy",
            "--defer-reward-to-post-process",
            "--builtin-reward-post-process",
            "--deferred-rm-type",
            "pairwise-genrm",
            "--pairwise-pairing",
            "round-robin",
            "--pairwise-rounds",
            "9",
        ],
        r"--pairwise-rounds 9: a round robin of --n-samples-per-prompt 8 has 7 rounds",
    ),
    "a deadline a custom hook would ignore": (
        [
            "--rm-type",
            "dummy",
            "--defer-reward-to-post-process",
            "--custom-reward-post-process-path",
            "my_rm.hook",
            "--group-judge-deadline-s",
            "30",
        ],
        r"--group-judge-deadline-s 30: the deadline applies to rl-core's own scoring, and "
        r"--custom-reward-post-process-path my_rm.hook scores the batch itself",
    ),
}


def _argv(extra: list[str]) -> list[str]:
    argv = list(BASE)
    if "--rm-type" in extra:
        i = argv.index("--rm-type")
        del argv[i : i + 2]
    return argv + extra


@pytest.mark.parametrize("name", list(CASES))
def test_refused_naming_flag_value_and_rule(name: str) -> None:
    extra, message = CASES[name]
    with pytest.raises(ConfigError) as err:
        check_group_judging(parse_train_args(_argv(extra)))
    assert re.search(message, str(err.value)), str(err.value)


def test_an_unknown_pairing_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_train_args(_argv(["--pairwise-pairing", "swiss"]))
    assert "--pairwise-pairing: invalid choice: 'swiss'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--pairwise-pairing", "round-robin", "--pairwise-rounds", "7"],
        ["--pairwise-pairing", "round-robin", "--pairwise-min-comparisons", "4"],
        ["--group-judge-deadline-s", "12.5", "--pairwise-score", "bradley_terry"],
        # not the run's reward: its settings are not checked against the groups
        ["--rm-type", "dapo-genrm", "--pairwise-rounds", "50"],
    ],
)
def test_settings_that_work_pass(extra: list[str]) -> None:
    cfg = parse_train_args(_argv(extra))
    check_group_judging(cfg)
    if "--group-judge-deadline-s" in extra:
        assert cfg.group_judge_deadline_s == 12.5 and cfg.pairwise_score == "bradley_terry"


def test_the_command_refuses_before_ray_starts(
    tmp_path: Path, tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through ``rl-core train`` itself: exit 2, one line, Ray never started."""
    import ray

    from rl_core.train import main

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1 + 1 =", "label": "2"}) + "\n")
    argv = _argv(["--pairwise-pairing", "round-robin", "--pairwise-rounds", "8"])
    argv[argv.index("m")] = str(tiny_model_path)
    argv[argv.index("d.jsonl")] = str(data)
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rl-core train: --pairwise-rounds 8: a round robin"), err
    assert len(err.splitlines()) == 1 and not ray.is_initialized()
