"""16-GPU plans on a simulated Ray cluster of two nodes × 8 GPUs (``ray.cluster_utils``).

Multi-node is a real Ray cluster, nothing home-made: these tests assert that an engine's bundles
sit on one node (or, for an engine that may span nodes, on whole nodes), which node each actor
landed on and which GPU Ray gave it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Under `uv run`, Ray would start every worker through `uv run` in a copy of the repo (slow, ~60 s).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import pytest
import ray
from ray.cluster_utils import Cluster

from rl_core.placement import (
    EnginePlacement,
    PlacementPlan,
    PlacementUnavailableError,
    add_placement_args,
    plan_from_args,
)
from rl_core.placement.realize import (
    RealizedPlacement,
    create_placement_groups,
    place_engines,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

_NODE = {
    "num_cpus": 8,  # logical CPUs: one per {GPU: 1, CPU: 1} bundle, not real cores
    "num_gpus": 8,
    "include_dashboard": False,
}


@ray.remote
class Where:
    """A stand-in for an engine or worker actor: reports where Ray put it."""

    def where(self) -> tuple[str, str | None]:
        return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES")


def plan(*argv: str) -> PlacementPlan:
    parser = argparse.ArgumentParser()
    add_placement_args(parser)
    return plan_from_args(parser.parse_args(list(argv)))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster(
        initialize_head=True,
        head_node_args={
            **_NODE,
            "_system_config": {
                "prestart_worker_first_driver": False,
                "enable_worker_prestart": False,
            },
        },
    )
    try:
        c.add_node(**_NODE)
        ray.init(address=c.address, log_to_driver=False)
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def made(cluster: Cluster) -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for thing in things:
        if isinstance(thing, RealizedPlacement):
            thing.remove()
        else:
            ray.kill(thing)
    wait_all_gpus_free(16)


def wait_all_gpus_free(total: int) -> None:
    """Removal is asynchronous: let the next test start from an empty cluster (PACK is greedy)."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < total and time.monotonic() < deadline:
        time.sleep(0.1)


def engine_actors(r: RealizedPlacement, role: str, instance: str | None = None) -> list[Any]:
    def make(engine: EnginePlacement, opts: dict[str, Any]) -> Any:
        opts = {k: v for k, v in opts.items() if k not in ("placement_group", "bundle_index")}
        return Where.options(**opts).remote()

    return place_engines(r, role, make, instance=instance)


def where(actors: list[Any]) -> list[tuple[str, str | None]]:
    return ray.get([a.where.remote() for a in actors], timeout=90)


def test_split_16_judge_engine_of_8_gpus_on_the_second_node(made: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge-397b", "--genrm-num-gpus-per-engine", "8",
        "--rollout-num-gpus-per-engine", "4",
        "--resource", '{"actor": [2, 8], "rollout": [1, 8], "genrm": [1, 8]}', "--colocate",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=90)
    made.append(r)
    slots = r.slots["colocate"]
    first, second = slots[0].node_id, slots[8].node_id
    assert first != second
    assert [s.node_id for s in slots] == [first] * 8 + [second] * 8  # contiguous per node
    assert [s.gpu_ids for s in slots] == [(str(i % 8),) for i in range(16)]

    rollout = engine_actors(r, "rollout")
    judge = engine_actors(r, "genrm", "__default__")
    workers = [Where.options(**r.worker_options("actor", k)).remote() for k in (7, 8)]
    made.extend([*rollout, *judge, *workers])
    assert where(rollout) == [(first, "0"), (first, "4")]
    assert where(judge) == [(second, "0")]
    assert where(workers) == [(first, "7"), (second, "0")]
    (engine,) = p.engines_of("genrm", "__default__")
    assert {s.node_id for s in r.engine_slots(engine)} == {second}  # never straddles
    assert r.engine_gpu_ids(engine) == tuple(str(i) for i in range(8))


def test_defer_swap_16_judge_engine_spans_whole_nodes(made: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge-397b", "--genrm-num-gpus-per-engine", "16",
        "--genrm-engine", "sglang", "--rollout-num-gpus-per-engine", "8",
        "--resource", '{"actor": [2, 8], "rollout": [2, 8], "genrm": [2, 8]}', "--colocate",
        "--rm-type", "dummy", "--defer-reward-to-post-process", "--builtin-reward-post-process",
    )  # fmt: skip
    assert p.mode == "colocate-defer-swap"
    r = create_placement_groups(p, timeout_s=90)
    made.append(r)
    (judge_engine,) = p.engines_of("genrm", "__default__")
    per_node = Counter(s.node_id for s in r.engine_slots(judge_engine))
    assert sorted(per_node.values()) == [8, 8]  # allowed to span: whole nodes only
    for engine in p.engines_of("rollout"):
        assert len({s.node_id for s in r.engine_slots(engine)}) == 1
    judge = engine_actors(r, "genrm", "__default__")
    made.extend(judge)
    assert where(judge) == [(r.slot("colocate", 0).node_id, "0")]


def test_engine_that_cannot_span_is_refused_when_it_lands_on_two_nodes(made: list[Any]) -> None:
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
        create_placement_groups(p, timeout_s=90)
    assert "landed on 2 nodes, and this engine cannot span nodes" in str(info.value)
    assert "smaller than --num-gpus-per-node 16" in str(info.value)
    # what it created was removed: all 16 GPUs can be taken again
    made.append(
        create_placement_groups(plan("--resource", '{"actor": [2, 8]}', "--colocate"), timeout_s=30)
    )


def test_fully_async_groups_each_on_one_node_without_sharing(made: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "2",
        "--rollout-num-gpus-per-engine", "2",
        "--resource", '{"actor": [1, 8], "rollout": [1, 6], "genrm": [1, 2]}', "--fully-async",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=90)
    made.append(r)
    gpus = [(s.node_id, s.gpu_ids) for slots in r.slots.values() for s in slots]
    assert len(set(gpus)) == 16  # no GPU given to two groups
    for engine in p.engines:
        assert len({s.node_id for s in r.engine_slots(engine)}) == 1
    assert len({s.node_id for s in r.slots["actor"]}) == 1


def test_judge_engine_workers_on_the_second_node(made: list[Any]) -> None:
    """genrm-serve's EngineWorker actors, created from the plan, on node 2's GPUs 0 and 4."""
    pytest.importorskip("genrm_serve.engines.worker")  # until the engines branch is merged
    from rl_core.placement import layout_request_from_args, plan_layout
    from rl_core.placement.realize import create_judge_engines

    parser = argparse.ArgumentParser()
    add_placement_args(parser)
    args = parser.parse_args(
        [
            "--genrm-model-path", "scripted", "--genrm-num-gpus-per-engine", "4",
            "--resource", '{"actor": [2, 8], "rollout": [1, 8], "genrm": [1, 8]}', "--colocate",
        ]
    )  # fmt: skip
    request = layout_request_from_args(args)
    r = create_placement_groups(plan_layout(request), timeout_s=90)
    made.append(r)
    (handles,) = create_judge_engines(r, request.genrm).values()
    made.extend(handles)
    infos = ray.get([h.info.remote() for h in handles], timeout=90)
    assert [i["cuda_visible_devices"] for i in infos] == ["0", "4"]
    second = r.slot("colocate", 8).node_id
    actor_nodes = {
        h._actor_id.hex(): ray._private.state.actors(h._actor_id.hex())["Address"]["NodeID"]
        for h in handles
    }
    assert set(actor_nodes.values()) == {second}
