"""Bad inputs to ``rl-core train`` are refused before Ray starts: exit 2, one line naming the
flag, the value and the rule, no traceback.

Each case is a command line a user could type; ``main`` runs as the command does, and the test
checks Ray was never started (the refusal is not a crash after the models loaded). One case runs
the real command in a subprocess, for the exit status and the seconds a refusal takes.
"""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rl_core.train import main

#: a flag's value in a case: remove the flag from the valid command line
DROP = "<drop>"
JUDGE = json.dumps({"__default__": {"model_path": "scripted:1", "num_gpus": 1}})


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


@pytest.fixture
def setup(tmp_path, tiny_model_path, monkeypatch):
    """A valid command line (tiny policy, scripted judge, a small data file) and a folder of
    bad inputs; a module of reward functions on sys.path."""
    good = _write(tmp_path / "train.jsonl", [{"prompt": "1 + 1 =", "label": "2"}] * 4)
    (tmp_path / "my_rm.py").write_text(
        textwrap.dedent(
            """
            async def good(args, sample):
                return {"score": 1.0}
            def plain(args, sample):
                return {"score": 1.0}
            async def one(sample):
                return {"score": 1.0}
            async def hook(args, samples):
                return None
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    base = [
        "--hf-checkpoint",
        str(tiny_model_path),
        "--prompt-data",
        str(good),
        "--genrm-instances",
        JUDGE,
        "--rm-type",
        "dapo-genrm",
        "--n-samples-per-prompt",
        "2",
        "--rollout-batch-size",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    return tmp_path, base


def _checkpoint(root: Path, seed: int) -> Path:
    step = root / "step_000001"
    step.mkdir(parents=True)
    extra = {"rollout_step": 1, "cursor": {"epoch": 0, "offset": 2, "size": 4, "seed": seed}}
    (step / "state.json").write_text(json.dumps({"step": 1, "extra": extra}))
    (root / "latest").write_text(step.name)
    return root


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name → (flags replacing / added to the valid command line, what the error must say)."""
    (tmp / "empty.jsonl").write_text("")
    _write(tmp / "keyless.jsonl", [{"question": "1 + 1 =", "label": "2"}])
    _write(tmp / "labelless.jsonl", [{"prompt": "1 + 1 ="}])
    _write(tmp / "one_bad.jsonl", [{"prompt": "1 + 1 =", "label": "2"}, "{not json"])
    (tmp / "folder").mkdir()
    (tmp / "empty-model").mkdir()
    (tmp / "used-run").mkdir()
    _write(tmp / "used-run" / "metrics.jsonl", [{"step": 1}, {"step": 2}])
    return {
        "missing prompt data": (
            ["--prompt-data", str(tmp / "nope.jsonl")],
            r"--prompt-data .*nope.jsonl: .* does not exist",
        ),
        "empty prompt data": (
            ["--prompt-data", str(tmp / "empty.jsonl")],
            r"--prompt-data .*empty.jsonl: .*no usable records",
        ),
        "keyless prompt data": (
            ["--prompt-data", str(tmp / "keyless.jsonl")],
            r"--prompt-data .*: .*missing key 'prompt' \(--input-key\)",
        ),
        "label-less prompt data": (
            ["--prompt-data", str(tmp / "labelless.jsonl")],
            r"missing key 'label' \(--label-key\)",
        ),
        "a folder as prompt data": (
            ["--prompt-data", str(tmp / "folder")],
            r"--prompt-data .*folder: .* is a folder; give the jsonl file",
        ),
        "missing eval data": (
            ["--eval-prompt-data", str(tmp / "nope.jsonl")],
            r"--eval-prompt-data .*nope.jsonl: .* does not exist",
        ),
        "label-less eval data": (
            ["--eval-prompt-data", str(tmp / "labelless.jsonl")],
            r"--eval-prompt-data .*missing key 'label'",
        ),
        "strict data with a bad record": (
            ["--prompt-data", str(tmp / "one_bad.jsonl"), "--strict-data"],
            r"one_bad.jsonl:2: invalid json.*\(--strict-data\)",
        ),
        "wrong input key": (["--input-key", "question"], r"missing key 'question' \(--input-key\)"),
        "wrong input key on the generated set": (
            ["--prompt-data", "gen:easy-math", "--input-key", "question"],
            r"--prompt-data gen:easy-math: .*missing key 'question' \(--input-key\)",
        ),
        "unknown rm type": (["--rm-type", "nope"], r"--rm-type nope: rm_type='nope'; registered"),
        "custom rm path without a dot": (
            ["--custom-rm-path", "nodot"],
            r"--custom-rm-path='nodot' must be 'module.func'",
        ),
        "custom rm path to a missing module": (
            ["--custom-rm-path", "no_such_mod.fn"],
            r"--custom-rm-path='no_such_mod.fn': module 'no_such_mod' not found",
        ),
        "custom rm path to a plain def": (
            ["--custom-rm-path", "my_rm.plain"],
            r"my_rm.plain is a synchronous callable",
        ),
        "custom rm path of one argument": (
            ["--custom-rm-path", "my_rm.one"],
            r"my_rm.one\(sample\) cannot be called with two arguments",
        ),
        "missing post-process hook names its own flag": (
            [
                "--rm-type",
                "dummy",
                "--defer-reward-to-post-process",
                "--custom-reward-post-process-path",
                "my_rm.nope",
            ],
            r"--custom-reward-post-process-path='my_rm.nope': module 'my_rm' has no attribute",
        ),
        "load of a folder that is no checkpoint": (
            ["--load", str(tmp / "folder")],
            r"--load .*folder: not a checkpoint",
        ),
        "load with another seed": (
            ["--load", str(_checkpoint(tmp / "ckpt", seed=7)), "--seed", "8"],
            r"--seed 8: the checkpoint .* was trained with --seed 7",
        ),
        "an empty policy folder": (
            ["--hf-checkpoint", str(tmp / "empty-model")],
            r"--hf-checkpoint .*empty-model: not a model folder \(no config.json",
        ),
        "a missing judge model": (
            ["--genrm-instances", DROP, "--genrm-model-path", "/no/such/model"],
            r"--genrm-model-path /no/such/model: no such folder",
        ),
        "a run dir holding another run's metrics": (
            ["--run-dir", str(tmp / "used-run")],
            r"--run-dir .*used-run: holds another run's metrics \(2 record\(s\), steps 1-2 in "
            r"metrics.jsonl\).*Pass --overwrite-run-dir to replace them, choose a new --run-dir, "
            r"or --load",
        ),
        "a judge adapter that is no adapter": (
            [
                "--genrm-instances",
                DROP,
                "--genrm-model-path",
                "embedded",
                "--genrm-engine-config",
                json.dumps({"adapter_path": str(tmp / "folder")}),
            ],
            r"--genrm-engine-config adapter_path .*folder: is not a LoRA adapter folder",
        ),
        "save where nothing can be written": (
            ["--save", "/dev/null/ckpt"],
            r"--save /dev/null/ckpt: not writable",
        ),
        "save-hf into a folder that is not empty": (
            ["--save-hf", str(tmp)],
            r"--save-hf .*: exists and is not empty",
        ),
        "save-hf inside the save folder": (
            ["--save", str(tmp / "ckpt-root"), "--save-hf", str(tmp / "ckpt-root" / "hf")],
            r"--save-hf .*ckpt-root/hf: is, holds or lies in --save .*ckpt-root",
        ),
        "save-hf where nothing can be written": (
            ["--save-hf", "/dev/null/hf"],
            r"--save-hf /dev/null/hf: .*not writable",
        ),
    }


def _replace(base: list[str], extra: list[str]) -> list[str]:
    """``base`` with each flag of ``extra`` set to its value there (added, replaced, or
    removed with the value ``DROP``)."""
    argv = list(base)
    i = 0
    while i < len(extra):
        flag = extra[i]
        value = extra[i + 1] if i + 1 < len(extra) and not extra[i + 1].startswith("--") else None
        if flag in argv:
            j = argv.index(flag)
            del argv[j : j + (2 if value is not None else 1)]
        if value != DROP:
            argv += [flag] + ([value] if value is not None else [])
        i += 2 if value is not None else 1
    return argv


def _names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return list(_cases(Path(d)))


@pytest.mark.parametrize("name", _names())
def test_bad_input_is_refused_before_ray_starts(name, setup, capsys):
    import re

    import ray

    tmp, base = setup
    extra, message = _cases(tmp)[name]
    assert main(_replace(base, extra)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rl-core train: "), err
    assert re.search(message, err), err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not ray.is_initialized()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_save_folder_is_refused(setup, capsys):
    tmp, base = setup
    save = tmp / "ro"
    save.mkdir()
    save.chmod(0o500)
    try:
        assert main([*base, "--save", str(save)]) == 2
    finally:
        save.chmod(0o700)
    assert "not writable" in capsys.readouterr().err


def test_save_without_room_for_one_checkpoint_is_refused(setup, capsys, monkeypatch):
    """The estimate: the policy's parameters (read from its safetensors header) x 12 bytes."""
    import shutil

    from rl_core.checkpoints import estimate_checkpoint_bytes

    tmp, base = setup
    needed = estimate_checkpoint_bytes(Path(base[1]))
    assert needed is not None and needed > 0
    usage = shutil.disk_usage(tmp)
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage._replace(free=needed - 1))
    assert main([*base, "--save", str(tmp / "ckpt")]) == 2
    assert "one checkpoint needs about" in capsys.readouterr().err


def test_the_command_refuses_in_seconds_with_exit_2(setup):
    _, base = setup
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rl_core.train", *base, "--rm-type", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("rl-core train: --rm-type nope"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 30, took


def test_a_used_run_dir_is_accepted_with_overwrite_or_load(setup):
    """The refusal's remedies pass preflight: ``--overwrite-run-dir`` (launch then clears the
    old records), and a resume (which cuts the records beyond its checkpoint)."""
    from rl_core.config import parse_train_args
    from rl_core.metrics import clear_run_records, logged_steps
    from rl_core.preflight import check_run_dir

    tmp, base = setup
    run = tmp / "run"
    run.mkdir()
    _write(run / "metrics.jsonl", [{"step": 1}])
    (run / "samples").mkdir()
    (run / "samples" / "step_000001.jsonl").write_text("{}\n")
    (run / "config.json").write_text("{}")
    check_run_dir(parse_train_args([*base, "--overwrite-run-dir"]))
    check_run_dir(parse_train_args([*base, "--load", str(_checkpoint(tmp / "ckpt", seed=1))]))
    assert clear_run_records(run) == [run / "metrics.jsonl", run / "samples"]
    assert logged_steps(run) == [] and (run / "config.json").is_file()
    check_run_dir(parse_train_args(base))  # the folder is free again
