"""A rollout engine killed while it holds a step's requests is a delay, not the run.

``rl-core train`` from flags (local Ray, genrm-serve's hf rollout engine on a tiny model, a rule
reward): on step 2's first generate call the test ``ray.kill``\\ s the rollout engine's actor
while the call is in flight. rl-core re-creates the engine in its bundle, sends it the weights
the old one served, and sends the requests again: every step completes with every sample once,
and step 2's metrics count the re-creation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow

GROUPS, SAMPLES = 2, 4


@pytest.mark.timeout(600)
async def test_a_rollout_engine_killed_mid_step_is_recreated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from genrm_serve import RemoteEngine
    from genrm_serve.testing import build_tiny_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    calls: list[str] = []
    killed: list[str] = []
    original = RemoteEngine.generate_many

    async def generate_many(self: RemoteEngine, requests: Any, **kwargs: Any) -> Any:
        calls.append(self.name)
        call = asyncio.ensure_future(original(self, requests, **kwargs))
        # step 2's first group (one call per group): kill the actor while it holds the call
        if len(calls) == GROUPS + 1 and self.name.startswith("rollout"):
            await asyncio.sleep(0.2)
            killed.append(self.name)
            ray.kill(self.handle, no_restart=True)
        return await call

    monkeypatch.setattr(RemoteEngine, "generate_many", generate_many)

    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
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
            str(GROUPS),
            "--n-samples-per-prompt",
            str(SAMPLES),
            "--rollout-max-response-len",
            "6",
            "--keep-cut-off",
            "--run-dir",
            str(tmp_path / "run"),
            "--colocate",
            "--device",
            "cpu",
        ]
    )
    assert await run_training(cfg) == 0
    assert killed == ["rollout-0"]
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert [r["rollout/engine_restarts"] for r in records] == [0, 1, 0]
    assert all(r["rollout/samples"] == GROUPS * SAMPLES for r in records)
    # every sample of every step once: the step files hold each (group, index) exactly once
    for step in (1, 2, 3):
        path = tmp_path / "run" / "samples" / f"step_{step:06d}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        keys = [(r["group"], r["index"]) for r in rows]
        assert len(keys) == GROUPS * SAMPLES and len(set(keys)) == len(keys), (step, keys)
    # the lost engine's requests were sent again: step 2's groups were both in flight to it (one
    # engine), so each was sent twice, the second time to the re-created rollout-0
    assert len(calls) == 4 * GROUPS and set(calls) == {"rollout-0"}
