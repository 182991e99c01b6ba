"""``rl-core train`` end to end from flags: local Ray, the judge service (scripted test engine
behind real Ray Serve + HTTP), genrm-serve's hf engine as the rollout engine (tiny random model),
dapo-genrm rewards, GRPO steps, evaluation, checkpoint, metrics and plots."""

import json
import tempfile
from pathlib import Path

import pytest

from genrm_serve.engines.hf.snapshot import PREFIX as SNAPSHOT_PREFIX
from genrm_serve.testing import scripted_model_path
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.layout import layout_problems
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow


def _snapshots_of(pid: int) -> list[str]:
    """The weight snapshots an engine process left in this host's temp dir."""
    return [p.name for p in Path(tempfile.gettempdir()).glob(f"{SNAPSHOT_PREFIX}*-{pid}-*")]


async def test_train_two_steps_from_flags(tmp_path, monkeypatch, shared_ray):
    from genrm_serve.testing import build_tiny_model

    # an authenticated service: rewards and the colocated sleep / wake must send the key
    monkeypatch.setenv("GENRM_API_KEY", "test-key-123")
    # a machine without GPUs, whatever this host has: the local Ray counts none and the job
    # computes on CPU (a GPU host's real layout: test_gpu_* and benchmarks/gpu_train.py)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
    evals = write_prompt_data(tmp_path / "eval.jsonl", make_easy_math(4, seed=2, shots=1))
    replies = {f"| {c}": "1" for c in "aeiou0123456789"}
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
            "--eval-prompt-data",
            str(evals),
            "--eval-interval",
            "2",
            "--rm-type",
            "dapo-genrm",
            "--genrm-instances",
            json.dumps(judge),
            "--num-rollout",
            "2",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "6",
            # the tiny random policy is cut off at the limit: train on it (the run is about
            # start-up, layout, eval and checkpoints)
            "--keep-cut-off",
            "--rollout-temperature",
            "1.2",
            "--lr",
            "1e-3",
            "--use-tis",
            "--save",
            str(tmp_path / "ckpt"),
            "--run-dir",
            str(tmp_path / "run"),
            "--colocate",
            "--device",
            "cpu",
        ]
    )
    assert await run_training(cfg) == 0
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    # every reward came from the judge, fresh or from its verdict cache (a random policy can
    # write one answer twice in a step); the message: what each step counted, if not
    counted = [
        {k: v for k, v in r.items() if k.startswith(("verdicts", "rollout/"))} for r in records
    ]
    judged = [r.get("verdicts/judge", 0) + r.get("verdicts/judge_cache", 0) for r in records]
    assert judged == [8, 8], counted
    # each judge call is on its sample's line, with who answered and how long it took
    for r in records:
        assert r["judge/calls"] == r.get("verdicts/judge", 0)  # a cached verdict is no new call
        assert r["judge/calls_per_sample"] == r["judge/calls"] / 8
        if r["judge/calls"]:
            assert 0 <= r["judge/latency_p50_s"] <= r["judge/latency_p99_s"]
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "samples" / "step_000001.jsonl").open()
    ]
    calls = [c for row in rows for c in row["details"]["judge_calls"]]
    fresh = [c for c in calls if c.get("cache") != "hit"]
    assert len(fresh) == records[0]["judge/calls"]
    assert {c["engine"] for c in fresh} == {"__default__/0"}
    assert all(c["reply"] in ("0", "1") and c["score"] == float(c["reply"]) for c in calls)
    assert records[-1]["weights/version"] == 2
    assert records[-1]["eval/samples"] == 4
    for name in ("reward.png", "accuracy.png", "length.png", "config.json"):
        assert (tmp_path / "run" / name).is_file()
    assert (tmp_path / "ckpt" / "latest").read_text() == "step_000002"
    layout = json.loads((tmp_path / "run" / "layout.json").read_text())
    assert layout_problems(layout) == []
    assert {a["role"] for a in layout["actors"]} == {"actor", "rollout", "genrm:__default__"}
    # the rollout engine slept on updated weights (a snapshot in the temp dir): the removal
    # of its placement group ends its process, and the snapshot with it
    (rollout_pid,) = [a["pid"] for a in layout["actors"] if a["role"] == "rollout"]
    assert _snapshots_of(rollout_pid) == []
