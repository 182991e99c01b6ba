"""A judge engine that dies mid-step is a delay, not a reward event.

``rl-core train`` from flags (local Ray, the judge service over HTTP, the hf rollout engine on a
tiny model): the scripted judge engine kills its own process on the step's first judge call
(``crash_once_file``). The service re-creates it in 8 s (its start is slow, as a model load is),
longer than genrm-client's retries of a 503 would wait but far inside the request deadline: every
sample of the step must be scored by the judge — none a judge error.
"""

import json

import pytest

from genrm_serve.testing import scripted_model_path
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow


async def test_a_judge_engine_killed_mid_step_costs_no_reward(tmp_path, monkeypatch, shared_ray):
    from genrm_serve.testing import build_tiny_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    train = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(8, seed=1, shots=1))
    crashed = tmp_path / "judge-crashed"
    # a re-creation takes 8 s (a model load), longer than the client's retries of a 503 last:
    # only requests that wait for the new engine are all answered
    script = {"default": "1", "crash_once_file": str(crashed), "start_delay_s": 8.0}
    judge = {
        "__default__": {
            "model_path": scripted_model_path(**script),
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
            "dapo-genrm",
            "--genrm-instances",
            json.dumps(judge),
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "4",
            "--rollout-max-response-len",
            "6",
            "--run-dir",
            str(tmp_path / "run"),
            "--colocate",
            "--device",
            "cpu",
        ]
    )
    assert await run_training(cfg) == 0
    assert crashed.is_file()  # the engine did die during the step
    (record,) = read_metrics(tmp_path / "run")
    assert record["rollout/judge_errors"] == 0
    # every sample's reward is a judge verdict: a fresh one, or one the verdict cache reused for a
    # sample with the same answer (how many depends on timing: an answer scored before its twin
    # is asked for is a cache hit; two asked at once are two calls)
    judged = record["verdicts/judge"] + record.get("verdicts/judge_cache", 0)
    assert judged == 8 and record["rollout/reward_samples"] == 8
