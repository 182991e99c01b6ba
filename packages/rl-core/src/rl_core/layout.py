"""Where every role of a run really is: read from Ray's state API and from the workers.

Written to ``RUN_DIR/layout.json`` once everything is started, so a user (and the tests) can
check the run against its plan: every actor alive in the plan's placement group, with the plan's
GPU share, on the GPU of its bundle; nothing pending; no GPU held by two roles except through the
plan's fractional shares (:func:`layout_problems` says what is wrong, if anything).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from genrm_serve import RemoteEngine, serve_namespace
from rl_core.engine_recovery import RecoverableEngine
from rl_core.limits import ENGINE_PROBE_TIMEOUT_S
from rl_core.participants import judge_id
from rl_core.placement.realize import RealizedPlacement

LAYOUT_FILE = "layout.json"

_INDEXED = re.compile(r"^(?P<res>GPU|CPU)_group_(?P<index>\d+)_(?P<pg>[0-9a-f]+)$")
_WILDCARD = re.compile(r"^(?P<res>GPU|CPU)_group_(?P<pg>[0-9a-f]+)$")


def _actor_id(handle: Any) -> str:
    return str(handle._actor_id.hex())


#: Ray's state names of an actor that is not running yet.
PENDING_STATES = ("PENDING_CREATION", "DEPENDENCIES_UNREADY")


@dataclass(frozen=True)
class StateView:
    """Ray's state API on this run's cluster: every actor by id, and the ids of this run's own
    actors (its job's) still waiting to be created. Another job's pending actor on a shared
    cluster is that job's business, not a fault of this run's layout; so are Serve's own actors
    (a proxy being started on the node a replica went to), which the judge service's deploy wait
    answers for."""

    actors: dict[str, Any]
    pending: list[str]


def read_state_api() -> StateView | None:
    """Ray's state API view of this cluster (needs its dashboard; None without one).

    Why the node check: the state API's server is looked up in this cluster's GCS, and a Ray
    started without the dashboard (``include_dashboard=False``, as ``rl-core train`` starts its
    local one) still records ``127.0.0.1:8265`` there (Ray 2.60). Whatever else listens on that
    port, such as another cluster's dashboard on the same machine, would then answer about *its*
    actors. A server that does not know this driver's node is not this cluster's.
    """
    try:
        import ray
        from ray.util.state import StateApiClient
        from ray.util.state.common import ActorState, ListApiOptions, StateResource

        ctx = ray.get_runtime_context()
        client = StateApiClient(address=ctx.gcs_address)
        mine = client.list(
            StateResource.NODES,
            options=ListApiOptions(filters=[("node_id", "=", ctx.get_node_id())]),
            raise_on_missing_output=False,
        )
        if not mine:  # another cluster's dashboard answered
            return None
        actors = cast(
            list[ActorState],
            client.list(
                StateResource.ACTORS,
                options=ListApiOptions(detail=True, limit=10_000),
                raise_on_missing_output=False,
            ),
        )
        job_id = ctx.get_job_id()
    except Exception:  # no dashboard on this cluster: the actors' own reports stand alone
        return None
    serve_ns = serve_namespace()
    return StateView(
        actors={a.actor_id: a for a in actors},
        pending=[
            a.actor_id
            for a in actors
            if a.state in PENDING_STATES and a.job_id == job_id and a.ray_namespace != serve_ns
        ],
    )


def _named(actor: Any) -> str:
    """An actor as a reader can find it: its id, class and name (Ray's state API record)."""
    name = f" {actor.name!r}" if getattr(actor, "name", None) else ""
    return f"{actor.actor_id} ({actor.class_name}{name}, {actor.state})"


def _plan_entry(
    realized: RealizedPlacement, role: str, rank: int, group: str, bundle: int, share: float
) -> dict[str, Any]:
    slot = realized.slot(group, bundle)
    return {
        "role": role,
        "rank": rank,
        "group": group,
        "bundle": bundle,
        "share": share,
        "bundle_index": slot.bundle_index,
        "bundle_gpu_ids": list(slot.gpu_ids),
        "bundle_node_id": slot.node_id,
    }


def _bundle_requests(required: Mapping[str, float]) -> dict[str, tuple[int | None, str, float]]:
    """Ray's ``required_resources`` of an actor in a placement group: ``GPU_group_<i>_<pg>`` →
    ``{"GPU": (bundle i, pg id, amount)}`` (the index-free ``GPU_group_<pg>`` entry only when an
    actor asked for any bundle)."""
    out: dict[str, tuple[int | None, str, float]] = {}
    for key, amount in required.items():
        m = _INDEXED.match(key)
        if m is not None:
            out[m["res"]] = (int(m["index"]), m["pg"], float(amount))
            continue
        m = _WILDCARD.match(key)
        if m is not None and m["res"] not in out:
            out[m["res"]] = (None, m["pg"], float(amount))
    return out


async def read_layout(
    realized: RealizedPlacement,
    trainer_groups: Mapping[str, Any],
    rollout_engines: Sequence[RemoteEngine | RecoverableEngine],
    judge_engines: Mapping[str, Sequence[RemoteEngine]],
) -> dict[str, Any]:
    """Every actor of the plan: the plan's entry, the actor's own report (its runtime context:
    node, placement group, assigned resources, GPU ids) and Ray's state API record."""
    from ray.util.placement_group import placement_group_table

    plan = realized.plan
    # (actor handle, plan entry, its report): every question has its deadline (the trainer
    # group's where, the engine actor's info)
    entries: list[tuple[Any, dict[str, Any], Awaitable[Any]]] = []
    for role, group in trainer_groups.items():
        rp = plan.roles[role]
        wheres = asyncio.ensure_future(group.where())
        for rank, worker in enumerate(group.workers):
            entry = _plan_entry(realized, role, rank, rp.group, rp.bundles[rank], rp.gpu_fraction)
            entries.append((worker, entry, _nth(wheres, rank)))
    engines = [
        ("rollout", e, p) for e, p in zip(rollout_engines, plan.engines_of("rollout"), strict=True)
    ]
    for key, judges in judge_engines.items():
        engines += [
            (judge_id(key), e, p)
            for e, p in zip(judges, plan.engines_of("genrm", key), strict=True)
        ]
    for role, engine, p in engines:
        entry = _plan_entry(realized, role, p.index, p.group, p.bundles[0], p.gpu_fraction)
        entries.append((engine.handle, entry, engine.info(timeout_s=ENGINE_PROBE_TIMEOUT_S)))
    reports = await asyncio.gather(*(f for _, _, f in entries))
    view = await asyncio.to_thread(read_state_api)
    state = view.actors if view is not None else None
    actors = []
    for (handle, entry, _), report in zip(entries, reports, strict=True):
        actor_id = _actor_id(handle)
        seen = state.get(actor_id) if state is not None else None
        actors.append(
            {
                **entry,
                "actor_id": actor_id,
                "node_id": report.get("node_id"),
                "pid": report.get("pid"),
                "placement_group_id": report.get("placement_group_id"),
                "assigned_resources": report.get("assigned_resources", {}),
                "gpu_ids": [str(g) for g in report.get("gpu_ids", [])],
                "cuda_visible_devices": report.get("cuda_visible_devices"),
                "state": getattr(seen, "state", None) if state is not None else "ALIVE",
                "name": getattr(seen, "name", None),
                "required_resources": dict(getattr(seen, "required_resources", None) or {}),
                "state_api_placement_group_id": getattr(seen, "placement_group_id", None),
            }
        )
    groups = {
        name: {
            "id": pg.id.hex(),
            "state": placement_group_table(pg).get("state"),
            "bundles": [
                {
                    "index": s.index,
                    "bundle_index": s.bundle_index,
                    "node_id": s.node_id,
                    "gpu_ids": list(s.gpu_ids),
                }
                for s in realized.slots[name]
            ],
        }
        for name, pg in realized.placement_groups.items()
    }
    return {
        "mode": plan.mode,
        "use_gpus": realized.use_gpus,
        "state_api": state is not None,
        "placement_groups": groups,
        "actors": actors,
        "pending_actors": [_named(view.actors[i]) for i in view.pending] if view else [],
    }


async def _nth(answers: Awaitable[list[Any]], n: int) -> Any:
    return (await answers)[n]


def write_layout(run_dir: Path, layout: dict[str, Any]) -> Path:
    path = Path(run_dir) / LAYOUT_FILE
    path.write_text(json.dumps(layout, indent=1, default=str))
    return path


def layout_problems(layout: Mapping[str, Any]) -> list[str]:
    """What in a layout report disagrees with its plan (empty when the run is as planned)."""
    problems: list[str] = []
    pg_ids = {g["id"]: name for name, g in layout["placement_groups"].items()}
    for name, g in layout["placement_groups"].items():
        if g["state"] != "CREATED":
            problems.append(f"placement group {name} is {g['state']}")
    if layout["pending_actors"]:
        problems.append(f"actors pending: {layout['pending_actors']}")
    held: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for a in layout["actors"]:
        who = f"{a['role']}[{a['rank']}]"
        if a["state"] != "ALIVE":
            problems.append(f"{who} is {a['state']}")
        for key in ("placement_group_id", "state_api_placement_group_id"):
            pg = a.get(key)
            if (pg is not None or key == "placement_group_id") and pg_ids.get(pg) != a["group"]:
                problems.append(f"{who}: {key} {pg}, the plan says group {a['group']}")
        if a["node_id"] != a["bundle_node_id"]:
            problems.append(
                f"{who} runs on node {a['node_id']}, its bundle is on {a['bundle_node_id']}"
            )
        gpu = float(a["assigned_resources"].get("GPU", 0.0))
        if layout["use_gpus"]:
            if abs(gpu - a["share"]) > 1e-9:
                problems.append(
                    f"{who} was assigned {gpu:g} GPU, the plan's share is {a['share']:g}"
                )
            if layout.get("state_api"):
                bundle, pg, asked = _bundle_requests(a["required_resources"]).get(
                    "GPU", (None, "", 0.0)
                )
                group_id = layout["placement_groups"][a["group"]]["id"]
                if (bundle, pg) != (a["bundle_index"], group_id):
                    problems.append(
                        f"{who} asked Ray for bundle {bundle} of placement group {pg}, the plan "
                        f"says bundle {a['bundle_index']} of {a['group']} ({group_id})"
                    )
                if abs(asked - a["share"]) > 1e-9:
                    problems.append(
                        f"{who} asked Ray for {asked:g} GPU, the plan's share is {a['share']:g}"
                    )
            if a["gpu_ids"] != a["bundle_gpu_ids"]:
                problems.append(
                    f"{who} got GPU {a['gpu_ids']}, its bundle {a['bundle']} is GPU "
                    f"{a['bundle_gpu_ids']}"
                )
            for g in a["gpu_ids"]:
                held[(str(a["node_id"]), g)].append((who, gpu))
        elif gpu:
            problems.append(f"{who} was assigned {gpu:g} GPU on a cluster without GPUs")
    for (node, gpu_id), holders in held.items():
        total = sum(share for _, share in holders)
        if total > 1.0 + 1e-9 or (len(holders) > 1 and any(share >= 1.0 for _, share in holders)):
            problems.append(f"GPU {gpu_id} of node {node[:8]} is held by {holders}")
    return problems
