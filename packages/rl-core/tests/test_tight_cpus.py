"""A plan whose bundles hold every CPU of the node still starts: the judge service asks for
nothing outside the placement groups, and every wait on Ray says what it waits for.

Issue 47's layout: one node of 8 logical GPUs and 8 CPUs, colocate with 8 bundles of
``{GPU: 1, CPU: 1}`` (actor, rollout and genrm each on all 8). Before, the service's ingress
replica asked for 0.1 CPU more and the run waited silently after "Started Serve" until killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from ray_clusters import logical_gpu_cluster

from genrm_serve import CapacityError, InstanceSpec, ServeArgs, check_service_fits
from genrm_serve.testing import scripted_model_path
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math, write_prompt_data
from rl_core.launch import run_training
from rl_core.metrics import read_metrics
from rl_core.waits import wait_saying


def _spec() -> dict[str, InstanceSpec]:
    return {"q": InstanceSpec(route_key="q", model_path="scripted", num_gpus=8, engine="scripted")}


def test_the_embedded_service_is_refused_when_its_ingress_cannot_fit() -> None:
    args = ServeArgs(ingress_num_cpus=0.1)
    with pytest.raises(CapacityError, match=r"CPU: needs 0.1, the cluster has 0") as err:
        check_service_fits(
            _spec(), args, {"CPU": 8.0, "GPU": 8.0}, {"CPU": 8.0}, reserved={"CPU": 8.0}
        )
    assert "cluster's CPU: 8" in str(err.value)  # the need, what is held, and the total
    # the engines live in the caller's bundles: only the ingress counts, and 0 CPU fits
    check_service_fits(
        _spec(),
        ServeArgs(ingress_num_cpus=0.0),
        {"CPU": 8.0, "GPU": 8.0},
        {"CPU": 8.0},
        reserved={"CPU": 8.0, "GPU": 8.0},
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_eight_bundles_on_eight_cpus_finish(tmp_path: Path) -> None:
    from genrm_serve.testing import build_tiny_model

    model = build_tiny_model(tmp_path / "policy")
    data = write_prompt_data(tmp_path / "train.jsonl", make_easy_math(4, seed=1, shots=1))
    judge = {
        "__default__": {
            "model_path": scripted_model_path(default="1"),
            "num_gpus": 8,
            "engine": "scripted",
            "engine_config": {"mem_fraction_static": 0.3},
        }
    }
    argv = [
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(data),
        "--num-rollout",
        "1",
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "8",
        "--rollout-max-response-len",
        "4",
        "--keep-cut-off",
        "--device",
        "cpu",
        "--rollout-engine",
        "hf",
        "--rm-type",
        "dapo-genrm",
        "--colocate",
        "--resource",
        '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}',
        "--sglang-mem-fraction-static",
        "0.6",
        "--genrm-instances",
        json.dumps(judge),
        "--run-dir",
        str(tmp_path / "run"),
    ]
    with logical_gpu_cluster(num_cpus=8, num_gpus=8):
        assert await run_training(parse_train_args(argv)) == 0
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1]


async def test_a_wait_says_what_it_waits_for(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rl_core")
    assert await wait_saying(asyncio.sleep(0.3, "done"), "the thing", 5.0, every_s=0.05) == "done"
    assert any("for the thing" in r.getMessage() for r in caplog.records)
    with pytest.raises(TimeoutError, match=r"the other thing: not done within 0 s"):
        await wait_saying(asyncio.sleep(5), "the other thing", 0.2, every_s=0.05)
