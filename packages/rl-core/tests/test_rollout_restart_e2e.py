"""A rollout engine whose actor dies mid-run is re-created, as a judge engine is: the run goes on.

``rl-core train`` from flags (local Ray, the hf rollout engine on a tiny model, colocated): once
step 1 is logged, the rollout engine's actor is killed (``ray.kill``, as an OOM kill or a crash
ends it). The next call to it re-creates it in its bundle with the last weights it was sent, and
sends its requests again: every step completes, each with every sample exactly once, and the
steps' metrics count the restart.
"""

import asyncio
import json
import logging

import pytest

from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def _kill_rollout_engine_after_step_1(run_dir, killed: list[str]) -> None:
    import ray

    metrics = run_dir / "metrics.jsonl"
    for _ in range(12_000):  # polled every 50 ms, up to the test's 10 minutes
        if metrics.is_file() and metrics.read_text().strip():
            break
        await asyncio.sleep(0.05)
    (name,) = [n for n in ray.util.list_named_actors() if n.endswith("rollout-0")]
    ray.kill(ray.get_actor(name))
    killed.append(name)


async def test_a_rollout_engine_killed_mid_run_is_recreated(
    tmp_path, monkeypatch, caplog, shared_ray
):
    from genrm_serve.testing import build_tiny_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
    run_dir = tmp_path / "run"
    cfg = parse_train_args(
        [
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(train),
            "--rm-type",
            "math",
            "--num-rollout",
            "3",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "6",
            "--keep-cut-off",
            "--lr",
            "1e-3",
            "--run-dir",
            str(run_dir),
            "--colocate",
            "--device",
            "cpu",
        ]
    )
    caplog.set_level(logging.WARNING, logger="rl_core")
    killed: list[str] = []
    killer = asyncio.ensure_future(_kill_rollout_engine_after_step_1(run_dir, killed))
    try:
        assert await run_training(cfg) == 0
    finally:
        killer.cancel()
    assert killed, "the rollout engine was not killed during the run"
    said = [r.getMessage() for r in caplog.records]
    assert any("rollout engine rollout-0 lost" in m for m in said), said
    assert any("rollout engine rollout-0 re-created" in m for m in said), said
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert sum(r["rollout/engine_restarts"] for r in records) == 1
    assert records[0]["rollout/engine_restarts"] == 0
    for r in records:
        assert r["rollout/samples"] == 8
        assert r["weights/version"] == r["step"]  # the new engine took every sync after it
    for step in (1, 2, 3):
        rows = [
            json.loads(line)
            for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        keys = [(row["group"], row["index"]) for row in rows]
        assert len(keys) == 8 and len(set(keys)) == 8  # every sample once
