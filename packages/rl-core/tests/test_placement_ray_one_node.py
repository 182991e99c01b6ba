"""Plans realised on a simulated one-node, 8-GPU Ray cluster (Ray's logical GPU resources).

Ray sets CUDA_VISIBLE_DEVICES for actors that ask for GPUs even on this CPU machine, so where each
actor landed — and which GPU it was given — can be asserted against the plan.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Under `uv run`, Ray would start every worker through `uv run` in a copy of the repo (slow, ~60 s).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import pytest
import ray

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

pytestmark = pytest.mark.timeout(120)


@ray.remote
class Where:
    """A stand-in for an engine or worker actor: reports where Ray put it."""

    def where(self) -> tuple[str, list[str], str | None]:
        return (
            ray.get_runtime_context().get_node_id(),
            [str(g) for g in ray.get_gpu_ids()],
            os.environ.get("CUDA_VISIBLE_DEVICES"),
        )


def plan(*argv: str) -> PlacementPlan:
    parser = argparse.ArgumentParser()
    add_placement_args(parser)
    return plan_from_args(parser.parse_args(list(argv)))


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(
        address="local",
        num_cpus=8,  # logical CPUs: one per {GPU: 1, CPU: 1} bundle, not real cores
        num_gpus=8,
        include_dashboard=False,
        log_to_driver=False,
        # no pool of idle workers started up front: this machine has 2 real cores
        _system_config={"prestart_worker_first_driver": False, "enable_worker_prestart": False},
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def realized(request: pytest.FixtureRequest, cluster: None) -> Iterator[list[Any]]:
    """Collects what a test creates and removes it afterwards, so tests do not see each other."""
    made: list[Any] = []
    yield made
    for thing in made:
        if isinstance(thing, RealizedPlacement):
            thing.remove()
        else:
            ray.kill(thing)
    wait_all_gpus_free(8)


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


def where(actors: list[Any]) -> list[tuple[str, list[str], str | None]]:
    return ray.get([a.where.remote() for a in actors], timeout=60)


SPLIT_8 = (
    "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "4",
    "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}', "--colocate",
)  # fmt: skip


def test_split_8_gpus_engines_and_workers_on_their_gpus(realized: list[Any]) -> None:
    p = plan(*SPLIT_8)
    r = create_placement_groups(p, timeout_s=60)
    realized.append(r)
    slots = r.slots["colocate"]
    assert [s.gpu_ids for s in slots] == [(str(i),) for i in range(8)]  # sorted by GPU id
    assert len({s.node_id for s in slots}) == 1

    rollout = engine_actors(r, "rollout")
    judge = engine_actors(r, "genrm", "__default__")
    ranks = [0, 7]
    workers = [Where.options(**r.worker_options("actor", k)).remote() for k in ranks]
    realized.extend(rollout + judge + workers)

    # rollout engines on GPUs 0..3, the 4-GPU judge engine's actor on GPU 4 driving 4..7
    assert [w[2] for w in where(rollout)] == ["0", "1", "2", "3"]
    assert [w[1] for w in where(rollout)] == [["0"], ["1"], ["2"], ["3"]]
    (judge_where,) = where(judge)
    assert judge_where[2] == "4"
    (judge_engine,) = p.engines_of("genrm", "__default__")
    assert r.engine_gpu_ids(judge_engine) == ("4", "5", "6", "7")
    # the actor's workers share every bundle with the engines (fractional GPUs)
    assert [w[2] for w in where(workers)] == [str(k) for k in ranks]


def test_shared_8_gpus_rollout_and_judge_on_the_same_gpus(realized: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-num-gpus-per-engine", "4",
        "--genrm-engine-config", '{"mem_fraction_static": 0.3}',
        "--rollout-num-gpus-per-engine", "4", "--sglang-mem-fraction-static", "0.6",
        "--resource", '{"actor": [1, 8], "rollout": [1, 8], "genrm": [1, 8]}', "--colocate",
    )  # fmt: skip
    assert p.mode == "colocate-shared"
    r = create_placement_groups(p, timeout_s=60)
    realized.append(r)
    rollout = engine_actors(r, "rollout")
    judge = engine_actors(r, "genrm", "__default__")
    worker0 = Where.options(**r.worker_options("actor", 0)).remote()
    realized.extend([*rollout, *judge, worker0])
    expected = ["0", "4"]
    assert [w[2] for w in where(rollout)] == expected
    assert [w[2] for w in where(judge)] == expected
    assert where([worker0])[0][2] == "0"  # actor, rollout engine and judge engine meet on GPU 0


def test_fully_async_groups_never_share_a_gpu(realized: list[Any]) -> None:
    p = plan(
        "--genrm-model-path", "/m/judge",
        "--resource",
        '{"actor": [1, 2], "rollout": [1, 3], "reference": [1, 1], "actor_fwd": [1, 1], '
        '"advantages": [1, 0], "genrm": [1, 1]}',
        "--fully-async",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=60)
    realized.append(r)
    assert set(r.placement_groups) == {"actor", "rollout", "reference", "actor_fwd", "genrm"}
    gpus = [g for slots in r.slots.values() for s in slots for g in s.gpu_ids]
    assert sorted(gpus, key=int) == [str(i) for i in range(8)]  # every GPU once: no sharing
    judge = engine_actors(r, "genrm", "__default__")
    realized.extend(judge)
    assert where(judge)[0][2] == r.slot("genrm", 0).gpu_ids[0]
    assert r.worker_options("actor", 0)["num_gpus"] == 1.0  # dedicated, not a fraction


def test_waiting_logs_and_gives_up_with_the_arithmetic(
    realized: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    p = plan(
        "--resource", '{"actor": [2, 8], "rollout": [2, 8]}', "--colocate",
    )  # fmt: skip
    caplog.set_level(logging.WARNING, logger="rl_core.placement.realize")
    with pytest.raises(PlacementUnavailableError) as info:
        create_placement_groups(p, timeout_s=2.5, log_interval_s=1.0)
    assert "needs 16 GPUs in total; the cluster has 8 GPUs" in str(info.value)
    assert any("waiting" in m and "needs 16 GPUs" in m for m in caplog.messages)
    # what it created was removed: the whole cluster is free again
    realized.append(create_placement_groups(plan(*SPLIT_8), timeout_s=30))


def test_cpu_only_realisation_for_machines_without_gpus(realized: list[Any]) -> None:
    """``use_gpus=False``: {CPU: 1} bundles and GPU-free actors (the CPU demo's layout)."""
    p = plan(
        "--genrm-model-path", "/m/judge", "--genrm-engine", "hf",
        "--resource", '{"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}', "--colocate",
    )  # fmt: skip
    r = create_placement_groups(p, timeout_s=60, use_gpus=False)
    realized.append(r)
    assert all(s.gpu_ids == () for s in r.slots["colocate"])
    opts = r.worker_options("actor", 1)
    assert opts["num_gpus"] == 0 and opts["num_cpus"] == 0.4
    judge = engine_actors(r, "genrm", "__default__")
    realized.extend(judge)
    node, gpus, _ = where(judge)[0]
    assert gpus == [] and node == r.slot("colocate", 1).node_id


def test_judge_engines_created_through_genrm_serve_in_their_bundles(realized: list[Any]) -> None:
    """Two judge instances (split): genrm-serve's EngineWorker actors land on the plan's GPUs."""
    pytest.importorskip("genrm_serve.engines.worker")  # until the engines branch is merged
    from rl_core.placement import layout_request_from_args, plan_layout
    from rl_core.placement.realize import create_judge_engines

    parser = argparse.ArgumentParser()
    add_placement_args(parser)
    args = parser.parse_args(
        [
            "--genrm-instances",
            '{"quality": {"model_path": "scripted", "num_gpus": 2, "num_gpus_per_engine": 2},'
            ' "safety": {"model_path": "scripted", "num_gpus": 2, "num_gpus_per_engine": 1}}',
            "--resource", '{"actor": [1, 8], "rollout": [1, 4], "genrm": [1, 4]}', "--colocate",
        ]
    )  # fmt: skip
    request = layout_request_from_args(args)
    p = plan_layout(request)
    r = create_placement_groups(p, timeout_s=60)
    realized.append(r)
    engines = create_judge_engines(r, request.genrm)
    realized.extend(h for handles in engines.values() for h in handles)
    assert {k: len(v) for k, v in engines.items()} == {"quality": 1, "safety": 2}
    infos = {
        k: ray.get([h.info.remote() for h in handles], timeout=60) for k, handles in engines.items()
    }
    pg_id = r.placement_groups["colocate"].id.hex()
    assert [i["cuda_visible_devices"] for i in infos["quality"]] == ["4"]
    assert [i["cuda_visible_devices"] for i in infos["safety"]] == ["6", "7"]
    assert all(i["placement_group_id"] == pg_id for v in infos.values() for i in v)
    assert [i["engine_index"] for i in infos["safety"]] == [0, 1]
