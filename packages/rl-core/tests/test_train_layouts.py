"""``rl-core train`` builds the layout its plan draws, on simulated GPU clusters.

A real Ray cluster of logical GPUs (one node × 2, then a second node × 4, ``ray.cluster_utils``)
and ``--device cpu``: placement uses the GPU bundles, compute runs on CPU. Each run trains 2 steps
with tiny random models (hf rollout engines, scripted judges behind the real service) and must end
with exit 0; its ``layout.json`` — read during the run from Ray's state API (the cluster runs the
dashboard) and from each actor's runtime context — must show every actor alive in the plan's
placement group and bundle, with the plan's GPU share, nothing pending, and no GPU held by two
roles except through the plan's fractional shares.

Each mode at its smallest layout that fills the node: every process of a run (trainer rank, engine)
costs seconds of the 2 CPU cores, and the 8- and 16-GPU shapes of the original's scripts are
placed, without training, by test_placement_ray.py. The last test checks that the state API view
is the run's own (its cluster's, its job's pending actors) beside another job and another cluster.
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

from genrm_serve.testing import scripted_model_path
from rl_core.config import parse_train_args
from rl_core.data import make_easy_math
from rl_core.launch import run_training
from rl_core.layout import LAYOUT_FILE, layout_problems
from rl_core.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

_NODE = {"num_cpus": 8, "num_gpus": 2}  # logical CPUs and GPUs, not real cores
_SECOND_NODE = {"num_cpus": 8, "num_gpus": 4}


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
        "model_path": scripted_model_path(default="0", replies=replies),
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
        # the tiny random policy is cut off at the limit: train on it, so every layout trains
        # and syncs weights
        "--keep-cut-off",
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
LAYOUTS = {
    # colocate-split at this shape (actor 2 = rollout 1 + genrm 1) and colocate-defer-swap on
    # two bundles are the examples' colocated and defer twins (integration_tests/
    # test_examples.py), which assert the same of their runs through `ray job submit`; 2
    # colocated steps from flags: test_launch_e2e.py
    "shared-2-2": (
        [
            *SPLIT,
            "--resource",
            '{"actor": [1, 2], "rollout": [1, 2], "genrm": [1, 2]}',
            "--sglang-mem-fraction-static",
            "0.6",
        ],
        2,
        0.3,
        "colocate-shared",
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
async def test_one_node_of_2_gpus(cluster: Cluster, files: dict[str, Path], name: str) -> None:
    layout, judge_gpus, mem, mode = LAYOUTS[name]
    report = await _train_and_check(files, name, layout, judge_gpus, mem, mode)
    gpus = {g for a in report["actors"] for g in a["gpu_ids"]}
    assert gpus == {"0", "1"}  # the whole node is used, by the plan's roles


async def test_a_plan_larger_than_the_cluster_is_refused_at_once(
    cluster: Cluster, files: dict[str, Path]
) -> None:
    import time

    from rl_core.placement import PlacementUnavailableError

    layout = [*SPLIT, "--resource", '{"actor": [2, 2], "rollout": [1, 2], "genrm": [1, 2]}']
    cfg = parse_train_args([*_argv(files, "too-big", *layout), "--genrm-instances", _judges(2)])
    t0 = time.monotonic()
    with pytest.raises(PlacementUnavailableError, match=r"GPU: needs 4, the cluster has 2"):
        await run_training(cfg)
    assert time.monotonic() - t0 < 30  # not the placement group's 600 s wait


async def test_two_nodes_fully_async(cluster: Cluster, files: dict[str, Path]) -> None:
    """6 GPUs on two nodes (2 + 4): the actor's 2 ranks fill one node, and every role of the mode
    (the reference in the loss, advantages on CPU) has its own GPU; every GPU of both nodes is
    used, each by one role."""
    cluster.add_node(**_SECOND_NODE)
    cluster.wait_for_nodes()
    layout = [
        "--fully-async",
        "--rm-type",
        "dapo-genrm",
        "--resource",
        '{"actor": [1, 2], "rollout": [1, 1], "reference": [1, 1], "actor_fwd": [1, 1], '
        '"advantages": [1, 0], "genrm": [1, 1]}',
        "--use-kl-loss",
        "--kl-loss-coef",
        "0.01",
    ]
    report = await _train_and_check(files, "two-nodes", layout, 1, None, "fully-async")
    nodes = {a["role"]: set() for a in report["actors"]}
    for a in report["actors"]:
        nodes[a["role"]].add(a["node_id"])
    assert len(nodes["actor"]) == 1
    assert len({n for ns in nodes.values() for n in ns}) == 2  # both nodes hold roles
    used = {(a["node_id"], g) for a in report["actors"] for g in a["gpu_ids"]}
    assert len(used) == 6  # every GPU of both nodes, each by one role (checked above)


# --- the state API view is this run's own: its cluster, its job ---------------------------------

_ANOTHER_JOB = """
import sys
import ray

ray.init(address=sys.argv[1], namespace="another-job", log_to_driver=False)


@ray.remote(num_cpus=0, resources={"nobody-has-this": 1})
class Waits:
    pass


print(Waits.options(name="waits", lifetime="detached").remote()._actor_id.hex())
"""

_ANOTHER_CLUSTER = """
import json
import sys
import ray
from ray import ray_constants
from ray.experimental import internal_kv
from ray.util.state import list_actors

from rl_core.layout import read_state_api

# a Ray without the dashboard, as `rl-core train` starts one; Ray records an API server address
# for it all the same, which here is the other cluster's dashboard (the case of two clusters
# on one machine, that one's dashboard on Ray's default port)
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
internal_kv._internal_kv_put(
    ray_constants.DASHBOARD_ADDRESS, sys.argv[1], namespace=ray_constants.KV_NAMESPACE_DASHBOARD
)
gcs = ray.get_runtime_context().gcs_address
plain = [a.name for a in list_actors(address=gcs, raise_on_missing_output=False)]
print(json.dumps({"plain_list_actors": plain, "view": read_state_api() is not None}))
"""


def test_the_state_view_is_this_runs_cluster_and_job(cluster: Cluster) -> None:
    """On a cluster shared with another job, that job's pending actor is not this run's problem
    (this run's own pending actor is), nor is one of Serve's, which Serve's controller schedules
    (it replaces a proxy slow to start); and a Ray whose recorded API server is another cluster's
    dashboard has no state view, rather than that cluster's actors."""
    import os
    import subprocess
    import sys
    import time

    import ray
    from ray import ray_constants
    from ray.experimental import internal_kv

    from genrm_serve import serve_namespace
    from rl_core.layout import read_state_api

    def python(script: str, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", script, *args],
            capture_output=True,
            text=True,
            timeout=240,
            env=os.environ | {"RAY_ADDRESS": ""},
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]

    @ray.remote(num_cpus=0, resources={"nobody-has-this": 1})
    class Waits:
        pass

    theirs = python(_ANOTHER_JOB, cluster.address)
    own = Waits.remote()
    serves = Waits.options(name="waits", namespace=serve_namespace()).remote()
    mine, serve_s = own._actor_id.hex(), serves._actor_id.hex()
    try:
        deadline = time.monotonic() + 60
        while True:
            view = read_state_api()
            assert view is not None, "the test cluster runs the dashboard: a view was expected"
            if {mine, theirs, serve_s} <= view.actors.keys() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for waiting in (theirs, serve_s):
            assert view.actors[waiting].state == "PENDING_CREATION", waiting  # seen, and waiting
        assert theirs not in view.pending and serve_s not in view.pending
        assert mine in view.pending

        dashboard = internal_kv._internal_kv_get(
            ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD
        ).decode()
        seen = json.loads(python(_ANOTHER_CLUSTER, dashboard))
        # what a plain list_actors(address=<its own GCS>) answered there: this cluster's actors
        assert "waits" in seen["plain_list_actors"]
        assert seen["view"] is False
    finally:
        ray.kill(own)
        ray.kill(serves)
        ray.kill(ray.get_actor("waits", namespace="another-job"))
