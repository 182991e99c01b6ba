"""Plans realised on simulated GPU clusters: one node × 8 GPUs, then two nodes × 8 GPUs.

Ray's logical GPU resources let placement run on this CPU machine, and Ray sets
CUDA_VISIBLE_DEVICES for actors that ask for GPUs even when none exist — so which node each actor
landed on, and which GPU it was given, can be asserted against the plan. Multi-node is a real Ray
cluster (``ray.cluster_utils``), nothing home-made.

One cluster serves the whole module (Ray start-up dominates the cost): the tests before
``two_nodes`` run on the head node alone (8 GPUs); the ``two_nodes`` fixture then adds a second
8-GPU node, so the module must run in file order (pytest's default).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

# Ray's environment is set by conftest.py (genrm_serve.testing.ray_test_env) before this import.
import pytest
import ray
from ray.cluster_utils import Cluster
from ray_clusters import logical_gpu_cluster

from rl_core.placement import (
    EnginePlacement,
    PlacementPlan,
    PlacementUnavailableError,
    add_placement_args,
    layout_request_from_args,
    plan_layout,
)
from rl_core.placement.realize import (
    RealizedPlacement,
    create_judge_engines,
    create_placement_groups,
    place_engines,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

_NODE = {
    "num_cpus": 8,  # logical CPUs: one per {GPU: 1, CPU: 1} bundle, not real cores
    "num_gpus": 8,
    "include_dashboard": False,
}


@ray.remote
class Where:
    """A stand-in for a rollout engine or a trainer worker: reports where Ray put it."""

    def where(self) -> tuple[str, list[str], str | None]:
        return (
            ray.get_runtime_context().get_node_id(),
            [str(g) for g in ray.get_gpu_ids()],
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_placement_args(parser)
    return parser.parse_args(list(argv))


def plan(*argv: str) -> PlacementPlan:
    return plan_layout(layout_request_from_args(parse(*argv)))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with logical_gpu_cluster(**_NODE) as c:
        yield c


@pytest.fixture(scope="module")
def two_nodes(cluster: Cluster) -> Cluster:
    cluster.add_node(**_NODE)
    cluster.wait_for_nodes()
    wait_gpus_free(16)
    return cluster


def gpus_total() -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def wait_gpus_free(total: int) -> None:
    """Removal is asynchronous: let the next test start from an empty cluster (PACK is greedy)."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < total and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture
def made(cluster: Cluster) -> Iterator[list[Any]]:
    """What a test creates, removed afterwards so the tests do not see each other."""
    things: list[Any] = []
    yield things
    for thing in things:
        if isinstance(thing, RealizedPlacement):
            thing.remove()
        else:
            ray.kill(thing)
    wait_gpus_free(gpus_total())


@pytest.fixture
def one_node(made: list[Any]) -> list[Any]:
    assert gpus_total() == 8, "the one-node tests run before `two_nodes` adds a node"
    return made


def stand_ins(r: RealizedPlacement, role: str, instance: str | None = None) -> list[Any]:
    def make(engine: EnginePlacement, opts: dict[str, Any]) -> Any:
        opts = {k: v for k, v in opts.items() if k not in ("placement_group", "bundle_index")}
        return Where.options(**opts).remote()

    return place_engines(r, role, make, instance=instance)


def where(actors: list[Any]) -> list[tuple[str, list[str], str | None]]:
    return ray.get([a.where.remote() for a in actors], timeout=120)


def infos(handles: list[Any]) -> list[dict[str, Any]]:
    return ray.get([h.info.remote() for h in handles], timeout=120)


def actor_node(handle: Any) -> str:
    """The node an actor runs on, from Ray's actor table (no dashboard needed)."""
    node: str = ray._private.state.actors(handle._actor_id.hex())["Address"]["NodeID"]
    return node


# -- one node, 8 GPUs ----------------------------------------------------------------------------


def test_split_8_two_judges_through_genrm_serve_engines(one_node: list[Any]) -> None:
    """8-GPU split with two judge instances: rollout on GPUs 0..3, quality 4..5, safety 6 and 7."""
    args = parse(
        "--genrm-instances",
        '{"quality": {"model_path": "scripted", "num_gpus": 2, "num_gpus_per_engine": 2},'
        ' "safety": {"model_path": "scripted", "num_gpus": 2, "num_gpus_per_engine": 1}}',
        "--rollout-num-gpus-per-engine", "2",
        "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}', "--colocate",
    )  # fmt: skip
    request = layout_request_from_args(args)
    p = plan_layout(request)
    r = create_placement_groups(p, timeout_s=120)
    one_node.append(r)
    slots = r.slots["colocate"]
    assert [s.gpu_ids for s in slots] == [(str(i),) for i in range(8)]  # sorted by GPU id
    assert len({s.node_id for s in slots}) == 1

    rollout = stand_ins(r, "rollout")
    judges = create_judge_engines(r, request.genrm)  # genrm-serve's EngineWorker actors
    workers = [Where.options(**r.worker_options("actor", k)).remote() for k in (0, 7)]
    one_node.extend([*rollout, *judges["quality"], *judges["safety"], *workers])

    assert [w[2] for w in where(rollout)] == ["0", "2"]
    assert [w[1] for w in where(rollout)] == [["0"], ["2"]]
    quality, safety = infos(judges["quality"]), infos(judges["safety"])
    assert [i["cuda_visible_devices"] for i in quality] == ["4"]
    assert [i["cuda_visible_devices"] for i in safety] == ["6", "7"]
    assert [i["engine_index"] for i in safety] == [0, 1]
    pg_id = r.placement_groups["colocate"].id.hex()
    assert all(i["placement_group_id"] == pg_id for i in quality + safety)
    (quality_engine,) = p.engines_of("genrm", "quality")
    assert r.engine_gpu_ids(quality_engine) == ("4", "5")
    # the actor's workers share the bundles with the engines (fractional GPUs)
    assert [w[2] for w in where(workers)] == ["0", "7"]


def test_shared_8_rollout_judge_and_actor_meet_on_one_gpu(one_node: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "8",
        "--genrm-engine-config", '{"mem_fraction_static": 0.3}',
        "--rollout-num-gpus-per-engine", "8", "--sglang-mem-fraction-static", "0.6",
        "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}', "--colocate",
    )  # fmt: skip
    assert p.mode == "colocate-shared"
    r = create_placement_groups(p, timeout_s=120)
    one_node.append(r)
    rollout = stand_ins(r, "rollout")
    judge = stand_ins(r, "genrm", "__default__")
    worker0 = Where.options(**r.worker_options("actor", 0)).remote()
    one_node.extend([*rollout, *judge, worker0])
    # all three alive at once in bundle 0: 0.2 + 0.2 + 0.4 of its GPU
    assert [w[2] for w in where([*rollout, *judge, worker0])] == ["0", "0", "0"]


def test_fully_async_groups_never_share_a_gpu(one_node: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge",
        "--resource",
        '{"actor": [1, 2], "rollout": [1, 3], "reference": [1, 1], "actor_fwd": [1, 1], '
        '"advantages": [1, 0], "genrm": [1, 1]}',
        "--fully-async",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=120)
    one_node.append(r)
    assert set(r.placement_groups) == {"actor", "rollout", "reference", "actor_fwd", "genrm"}
    gpus = [g for slots in r.slots.values() for s in slots for g in s.gpu_ids]
    assert sorted(gpus, key=int) == [str(i) for i in range(8)]  # every GPU once: no sharing
    judge = stand_ins(r, "genrm", "__default__")
    one_node.extend(judge)
    assert where(judge)[0][2] == r.slot("genrm", 0).gpu_ids[0]
    assert r.worker_options("actor", 0)["num_gpus"] == 1.0  # dedicated, not a fraction


def test_waiting_logs_and_gives_up_with_the_arithmetic(
    one_node: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    p = plan("--resource", '{"actor": [2, 8], "rollout": [2, 8]}', "--colocate")
    caplog.set_level(logging.WARNING, logger="rl_core.placement.realize")
    with pytest.raises(PlacementUnavailableError) as info:
        create_placement_groups(p, timeout_s=2.5, log_interval_s=1.0)
    assert "needs 16 GPUs in total; the cluster has 8 GPUs" in str(info.value)
    assert any("waiting" in m and "needs 16 GPUs" in m for m in caplog.messages)
    # what it created was removed: all 8 GPUs can be taken again
    one_node.append(
        create_placement_groups(plan("--resource", '{"actor": [1, 8]}', "--colocate"), timeout_s=60)
    )


def test_cpu_only_realisation_for_machines_without_gpus(one_node: list[Any]) -> None:
    """``use_gpus=False``: {CPU: 1} bundles and GPU-free actors (the CPU demo's layout)."""
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-engine", "hf",
        "--resource", '{"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}', "--colocate",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=120, use_gpus=False)
    one_node.append(r)
    assert all(s.gpu_ids == () for s in r.slots["colocate"])
    opts = r.worker_options("actor", 1)
    assert opts["num_gpus"] == 0 and opts["num_cpus"] == 0.4
    judge = stand_ins(r, "genrm", "__default__")
    one_node.extend(judge)
    node, gpus, _ = where(judge)[0]
    assert gpus == [] and node == r.slot("colocate", 1).node_id


# -- two nodes × 8 GPUs --------------------------------------------------------------------------


def test_split_16_judge_engine_of_8_gpus_on_the_second_node(
    two_nodes: Cluster, made: list[Any]
) -> None:
    args = parse(
        "--genrm-model-path", "scripted", "--genrm-num-gpus-per-engine", "8",
        "--rollout-num-gpus-per-engine", "4",
        "--resource", '{"actor": [2, 8], "rollout": [1, 8], "genrm": [1, 8]}', "--colocate",
    )  # fmt: skip
    request = layout_request_from_args(args)
    p = plan_layout(request)
    r = create_placement_groups(p, timeout_s=120)
    made.append(r)
    slots = r.slots["colocate"]
    first, second = slots[0].node_id, slots[8].node_id
    assert first != second
    assert [s.node_id for s in slots] == [first] * 8 + [second] * 8  # contiguous per node
    assert [s.gpu_ids for s in slots] == [(str(i % 8),) for i in range(16)]

    rollout = stand_ins(r, "rollout")
    (judge,) = create_judge_engines(r, request.genrm)["__default__"]
    worker8 = Where.options(**r.worker_options("actor", 8)).remote()  # shares the judge's bundle
    made.extend([*rollout, judge, worker8])
    assert [(w[0], w[2]) for w in where(rollout)] == [(first, "0"), (first, "4")]
    assert [(w[0], w[2]) for w in where([worker8])] == [(second, "0")]
    assert infos([judge])[0]["cuda_visible_devices"] == "0"
    assert actor_node(judge) == second
    (engine,) = p.engines_of("genrm", "__default__")
    assert {s.node_id for s in r.engine_slots(engine)} == {second}  # never straddles
    assert r.engine_gpu_ids(engine) == tuple(str(i) for i in range(8))


def test_defer_swap_16_judge_engine_spans_whole_nodes(two_nodes: Cluster, made: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge-397b", "--genrm-num-gpus-per-engine", "16",
        "--genrm-engine", "sglang", "--rollout-num-gpus-per-engine", "8",
        "--resource", '{"actor": [2, 8], "rollout": [2, 8], "genrm": [2, 8]}', "--colocate",
        "--rm-type", "dummy", "--defer-reward-to-post-process", "--builtin-reward-post-process",
    )  # fmt: skip
    assert p.mode == "colocate-defer-swap"
    r = create_placement_groups(p, timeout_s=120)
    made.append(r)
    (judge_engine,) = p.engines_of("genrm", "__default__")
    per_node = Counter(s.node_id for s in r.engine_slots(judge_engine))
    assert sorted(per_node.values()) == [8, 8]  # allowed to span: whole nodes only
    for engine in p.engines_of("rollout"):
        assert len({s.node_id for s in r.engine_slots(engine)}) == 1
    judge = stand_ins(r, "genrm", "__default__")
    made.extend(judge)
    node, _, visible = where(judge)[0]
    assert (node, visible) == (r.slot("colocate", 0).node_id, "0")


def test_engine_that_cannot_span_is_refused_when_it_lands_on_two_nodes(
    two_nodes: Cluster, made: list[Any]
) -> None:
    # The user claims 16-GPU nodes, so the plan accepts one 16-GPU hf engine; the cluster's nodes
    # have 8, and the realisation must refuse rather than start an engine across two nodes.
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "16",
        "--genrm-engine", "hf", "--num-gpus-per-node", "16",
        "--genrm-engine-config", '{"mem_fraction_static": 0.3}',
        "--sglang-mem-fraction-static", "0.6",
        "--resource", '{"actor": [1, 16], "rollout": [1, 16], "genrm": [1, 16]}', "--colocate",
    )  # fmt: skip
    with pytest.raises(PlacementUnavailableError) as info:
        create_placement_groups(p, timeout_s=120)
    assert "landed on 2 nodes, and this engine cannot span nodes" in str(info.value)
    assert "smaller than --num-gpus-per-node 16" in str(info.value)
    # what it created was removed: all 16 GPUs can be taken again
    made.append(
        create_placement_groups(plan("--resource", '{"actor": [2, 8]}', "--colocate"), timeout_s=60)
    )


def test_fully_async_16_groups_each_on_one_node_without_sharing(
    two_nodes: Cluster, made: list[Any]
) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "2",
        "--rollout-num-gpus-per-engine", "2",
        "--resource", '{"actor": [1, 8], "rollout": [1, 6], "genrm": [1, 2]}', "--fully-async",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=120)
    made.append(r)
    gpus = [(s.node_id, s.gpu_ids) for slots in r.slots.values() for s in slots]
    assert len(set(gpus)) == 16  # no GPU given to two groups
    for engine in p.engines:
        assert len({s.node_id for s in r.engine_slots(engine)}) == 1
    assert len({s.node_id for s in r.slots["actor"]}) == 1
