"""``rl-core train --rm-type pairwise-genrm`` end to end from flags: local Ray, the judge service
(scripted test engine behind real Ray Serve + HTTP), the hf rollout engine (tiny random model),
a group's responses compared in pairs with a deadline per group, GRPO steps, metrics.

The scripted judge answers "1" (Response A better) when A's first quoted line starts with a
vowel or a digit, else "0": its verdicts depend on the responses and on which one is read
first, so some pairs flip with the order and the step's flip share is neither 0 nor
undefined."""

import json

import pytest

from genrm_serve.testing import scripted_model_path
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow


async def test_train_two_steps_with_pairwise_rewards(
    tmp_path, monkeypatch, tiny_run_flags, shared_ray
):
    from genrm_serve.testing import build_tiny_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
    replies = {f"<<<BEGIN RESPONSE A>>>\n| {c}": "1" for c in "aeiouAEIOU0123456789"}
    judge = {
        "__default__": {
            "model_path": scripted_model_path(default="0", replies=replies),
            "num_gpus": 1,
            "engine": "scripted",
        }
    }
    cfg = parse_train_args(
        [
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(train),
            "--rm-type",
            "pairwise-genrm",
            "--pairwise-pairing",
            "round-robin",
            "--pairwise-rounds",
            "3",
            "--group-judge-deadline-s",
            "300",
            "--genrm-instances",
            json.dumps(judge),
            *tiny_run_flags,
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert await run_training(cfg) == 0
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        # 2 groups of 4, 3 rounds of 2 pairs each: 6 pairs a group, every one in both orders
        assert r["rollout/pairwise_pairs"] == 12, r
        share = r["rollout/pairwise_flip_share"]
        assert share is not None and 0.0 <= share <= 1.0
        assert r["rollout/judge_timeouts"] == 0 and r["rollout/judge_errors"] == 0
        assert r["verdicts/judge"] == 8
    rows = [
        json.loads(line)
        for f in sorted((tmp_path / "run" / "samples").glob("step_*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert len(rows) == 16
    for row in rows:
        assert row["status"] == "ok" and 0.0 <= row["reward"] <= 1.0
        part = row["details"]["details"]["pairwise"]
        assert part["comparisons"] == 6 and len(part["opponents"]) == 3
        assert part["score_rule"] == "win_rate"
        # a win rate over 6 comparisons with 0 / 1 verdicts
        assert row["reward"] * 6 == pytest.approx(round(row["reward"] * 6))
