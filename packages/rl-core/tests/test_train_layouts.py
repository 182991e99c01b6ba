"""``rl-core train`` builds the layout its plan draws, on simulated GPU clusters.

A real Ray cluster of logical GPUs (one node × 8, then two nodes × 8, ``ray.cluster_utils``) and
``--device cpu``: placement uses the GPU bundles, compute runs on CPU. Each run trains 2 steps with
tiny random models (hf rollout engines, scripted judges behind the real service) and must end with
exit 0; its ``layout.json`` — read during the run from Ray's state API (the cluster runs the
dashboard) and from each actor's runtime context — must show every actor alive in the plan's
placement group and bundle, with the plan's GPU share, nothing pending, and no GPU held by two
roles except through the plan's fractional shares.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster
from ray_clusters import logical_gpu_cluster

from rl_core.config import parse_train_args
from rl_core.data import make_easy_math
from rl_core.launch import run_training
from rl_core.layout import LAYOUT_FILE, layout_problems
from rl_core.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

_NODE = {"num_cpus": 16, "num_gpus": 8}  # logical CPUs and GPUs, not real cores


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with logical_gpu_cluster(dashboard=True, **_NODE) as c:  # the state API needs the dashboard
        yield c


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from genrm_serve.testing import build_tiny_model

    root = tmp_path_factory.mktemp("layouts")
    model = build_tiny_model(root / "policy")
    data = root / "train.jsonl"
    with data.open("w") as f:
        for r in make_easy_math(8, seed=1, shots=1):
            f.write(json.dumps({"prompt": r.prompt, "label": r.label, "metadata": r.metadata}))
            f.write("\n")
    return {"root": root, "model": model, "data": data}


def _judges(num_gpus: int, mem: float | None = None) -> str:
    replies = {f"| {c}": "1" for c in "aeiou0123456789"}
    spec: dict[str, Any] = {
        "model_path": "scripted:" + json.dumps({"default": "0", "replies": replies}),
        "num_gpus": num_gpus,
        "engine": "scripted",
    }
    if mem is not None:
        spec["engine_config"] = {"mem_fraction_static": mem}
    return json.dumps({"__default__": spec})


def _argv(files: dict[str, Path], name: str, *layout: str) -> list[str]:
    return [
        "--hf-checkpoint",
        str(files["model"]),
        "--prompt-data",
        str(files["data"]),
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "4",
        "--lr",
        "1e-3",
        "--device",
        "cpu",
        "--rollout-engine",
        "hf",
        "--run-dir",
        str(files["root"] / name),
        *layout,
    ]


SPLIT = ["--colocate", "--rm-type", "dapo-genrm"]
DEFER = [
    "--colocate",
    "--rm-type",
    "dummy",
    "--defer-reward-to-post-process",
    "--builtin-reward-post-process",
]

LAYOUTS = {
    "split-4-4": (
        [*SPLIT, "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}'],
        4,
        None,
        "colocate-split",
    ),
    "shared-8-8": (
        [
            *SPLIT,
            "--resource",
            '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}',
            "--sglang-mem-fraction-static",
            "0.6",
        ],
        8,
        0.3,
        "colocate-shared",
    ),
    "defer-swap": (
        [*DEFER, "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}'],
        8,
        None,
        "colocate-defer-swap",
    ),
    "fully-async": (
        [
            "--fully-async",
            "--rm-type",
            "dapo-genrm",
            "--resource",
            '{"actor": [1, 2], "rollout": [1, 3], "reference": [1, 1], "actor_fwd": [1, 1], '
            '"advantages": [1, 0], "genrm": [1, 1]}',
            "--use-kl-loss",
            "--kl-loss-coef",
            "0.01",
        ],
        1,
        None,
        "fully-async",
    ),
}


async def _train_and_check(
    files: dict[str, Path],
    name: str,
    layout: list[str],
    judge_gpus: int,
    mem: float | None,
    mode: str,
) -> dict[str, Any]:
    cfg = parse_train_args(
        [*_argv(files, name, *layout), "--genrm-instances", _judges(judge_gpus, mem)]
    )
    assert cfg.mode == mode
    assert await run_training(cfg) == 0
    run = files["root"] / name
    assert [r["step"] for r in read_metrics(run)] == [1, 2]
    report = json.loads((run / LAYOUT_FILE).read_text())
    assert report["state_api"], "the layout was read without Ray's state API"
    assert layout_problems(report) == []
    plan = cfg.plan
    roles = Counter(a["role"] for a in report["actors"])
    expected = {
        r: len(p.bundles) for r, p in plan.roles.items() if r not in ("genrm", "advantages")
    }
    expected["rollout"] = len(plan.engines_of("rollout"))
    expected |= {f"genrm:{k}": len(plan.engines_of("genrm", k)) for k in plan.judges}
    assert dict(roles) == expected
    return report


@pytest.mark.parametrize("name", list(LAYOUTS))
async def test_one_node_of_8_gpus(cluster: Cluster, files: dict[str, Path], name: str) -> None:
    layout, judge_gpus, mem, mode = LAYOUTS[name]
    report = await _train_and_check(files, name, layout, judge_gpus, mem, mode)
    gpus = {g for a in report["actors"] for g in a["gpu_ids"]}
    assert gpus == {str(i) for i in range(8)}  # the whole node is used, by the plan's roles


async def test_a_plan_larger_than_the_cluster_is_refused_at_once(
    cluster: Cluster, files: dict[str, Path]
) -> None:
    import time

    from rl_core.placement import PlacementUnavailableError

    layout = [*SPLIT, "--resource", '{"actor": [2, 8], "rollout": [1, 8], "genrm": [1, 8]}']
    cfg = parse_train_args([*_argv(files, "too-big", *layout), "--genrm-instances", _judges(8)])
    t0 = time.monotonic()
    with pytest.raises(PlacementUnavailableError, match=r"GPU: needs 16, the cluster has 8"):
        await run_training(cfg)
    assert time.monotonic() - t0 < 30  # not the placement group's 600 s wait


async def test_two_nodes_of_8_gpus_fully_async(cluster: Cluster, files: dict[str, Path]) -> None:
    """16 GPUs on two nodes: the actor's 8 ranks fill one node, the other roles the other."""
    cluster.add_node(**_NODE)
    cluster.wait_for_nodes()
    layout = [
        "--fully-async",
        "--rm-type",
        "dapo-genrm",
        "--resource",
        '{"actor": [1, 8], "rollout": [1, 4], "reference": [1, 1], "actor_fwd": [1, 1], '
        '"genrm": [1, 2]}',
    ]
    report = await _train_and_check(files, "two-nodes", layout, 2, None, "fully-async")
    nodes = {a["role"]: set() for a in report["actors"]}
    for a in report["actors"]:
        nodes[a["role"]].add(a["node_id"])
    assert len(nodes["actor"]) == 1
    used = {(a["node_id"], g) for a in report["actors"] for g in a["gpu_ids"]}
    assert len(used) == 16  # every GPU of both nodes, each by one role (checked above)
