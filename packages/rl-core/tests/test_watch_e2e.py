"""A short CPU training with ``--use-wandb --wandb-mode offline`` and the math-verify audit, end
to end (local Ray, the scripted judge behind Ray Serve + HTTP, genrm-serve's hf engine on a tiny
random policy): the offline W&B run read back from its files holds what ``metrics.jsonl`` and
``samples/`` hold, every step has its ``watch/`` metrics and sample flags, and ``rl-core show``
reads the run folder."""

from __future__ import annotations

import json

import pytest
from wandb_files import history, offline_runs, run_info, summary, table_rows

from genrm_serve.testing import scripted_model_path
from rl_core.cli import main as cli
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow


async def test_an_offline_wandb_run_of_a_cpu_training(
    tmp_path, monkeypatch, capsys, tiny_run_flags, shared_ray
):
    pytest.importorskip("wandb")
    from genrm_serve.testing import build_tiny_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
    # a judge that passes much of what the random policy writes: math-verify disagrees
    replies = {f"| {c}": "1" for c in "aeiou0123456789"}
    judge = {
        "__default__": {
            "model_path": scripted_model_path(default="0", replies=replies),
            "num_gpus": 1,
            "engine": "scripted",
        }
    }
    run = tmp_path / "run"
    cfg = parse_train_args(
        [
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(train),
            "--rm-type",
            "dapo-genrm",
            "--rule-audit",
            "--genrm-instances",
            json.dumps(judge),
            *tiny_run_flags,
            "--run-dir",
            str(run),
            "--use-wandb",
            "--wandb-mode",
            "offline",
            "--wandb-project",
            "genrm-tests",
            "--wandb-group",
            "e2e",
        ]
    )
    assert await run_training(cfg) == 0
    out = capsys.readouterr().out
    assert "reward-hacking watch" in out
    assert "W&B: offline, upload with `wandb sync`" in out

    records = read_metrics(run)
    assert [r["step"] for r in records] == [1, 2]
    (folder,) = offline_runs(run)
    assert (run_info(folder).project, run_info(folder).run_group) == ("genrm-tests", "e2e")
    logged = history(folder)
    for record in records:
        step = record["step"]
        assert record["watch/judged"] == 8  # every sample judged (no rule gate)
        assert isinstance(record["watch/false_pass"], int)
        for key, value in record.items():  # every metric of the file, under its name
            if key != "time" and value is not None:
                assert logged[step][key] == value, (step, key)
        rows = [
            json.loads(line)
            for line in (run / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        flagged = sum("false_pass" in r["flags"] for r in rows)
        assert flagged == record["watch/false_pass"]
        table = table_rows(folder, logged[step]["samples"])
        assert [t["response"] for t in table] == [r["response"] for r in rows]
        assert [t["math-verify"] for t in table] == [r["details"].get("rule") for r in rows]
    assert {"curves/reward", "curves/accuracy", "curves/length"} <= set(logged[2])
    assert "watch/warnings" in summary(folder)
    watch = [json.loads(line) for line in (run / "watch.jsonl").read_text().splitlines()]
    assert [w["step"] for w in watch] == [1, 2]

    # the same folder in the terminal
    assert cli(["show", str(run)]) == 0
    shown = capsys.readouterr().out
    assert "what each step learned from" in shown and "watch/false_pass_share" in shown
    assert cli(["show", str(run), "--step", "2", "--flagged"]) == 0
    assert f"(flagged): {sum(bool(r['flags']) for r in rows)}" in capsys.readouterr().out
    assert cli(["show", str(run), "--step", "1", "--sample", "0"]) == 0
    assert "reward details" in capsys.readouterr().out
