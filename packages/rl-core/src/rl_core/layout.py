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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.placement.realize import RealizedPlacement

LAYOUT_FILE = "layout.json"

_INDEXED = re.compile(r"^(?P<res>GPU|CPU)_group_(?P<index>\d+)_(?P<pg>[0-9a-f]+)$")
_WILDCARD = re.compile(r"^(?P<res>GPU|CPU)_group_(?P<pg>[0-9a-f]+)$")


def _actor_id(handle: Any) -> str:
    return str(handle._actor_id.hex())


def _state_api_actors() -> dict[str, Any] | None:
    """Ray's state API view of every actor (needs the dashboard; None without one)."""
    try:
        import ray
        from ray.util.state import list_actors

        # this cluster's address, explicitly: left to itself the state API picks "the latest"
        # of the clusters on the machine
        address = ray.get_runtime_context().gcs_address
        actors = list_actors(
            address=address, detail=True, limit=10_000, raise_on_missing_output=False
        )
    except Exception:  # no dashboard on this cluster: the actors' own reports stand alone
        return None
    return {a.actor_id: a for a in actors}


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
    rollout_engines: Sequence[Any],
    judge_actors: Mapping[str, Sequence[Any]],
) -> dict[str, Any]:
    """Every actor of the plan: the plan's entry, the actor's own report (its runtime context:
    node, placement group, assigned resources, GPU ids) and Ray's state API record."""
    from ray.util.placement_group import placement_group_table

    plan = realized.plan
    entries: list[tuple[Any, dict[str, Any], Any]] = []  # (handle, plan entry, report future)
    for role, group in trainer_groups.items():
        rp = plan.roles[role]
        for rank, worker in enumerate(group.workers):
            entry = _plan_entry(realized, role, rank, rp.group, rp.bundles[rank], rp.gpu_fraction)
            entries.append((worker, entry, worker.where.remote()))
    engines = [
        ("rollout", e.actor, p)
        for e, p in zip(rollout_engines, plan.engines_of("rollout"), strict=True)
    ]
    for key, actors in judge_actors.items():
        engines += [
            (f"genrm:{key}", a, p)
            for a, p in zip(actors, plan.engines_of("genrm", key), strict=True)
        ]
    for role, actor, p in engines:
        entry = _plan_entry(realized, role, p.index, p.group, p.bundles[0], p.gpu_fraction)
        entries.append((actor, entry, actor.info.remote()))
    reports = await asyncio.gather(*(f for _, _, f in entries))
    state = await asyncio.to_thread(_state_api_actors)
    actors = []
    for (handle, entry, _), report in zip(entries, reports, strict=True):
        actor_id = _actor_id(handle)
        seen = state.get(actor_id) if state is not None else None
        actors.append(
            {
                **entry,
                "actor_id": actor_id,
                "node_id": report.get("node_id"),
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
    pending = (
        [
            a.actor_id
            for a in state.values()
            if a.state in ("PENDING_CREATION", "DEPENDENCIES_UNREADY")
        ]
        if state is not None
        else []
    )
    return {
        "mode": plan.mode,
        "use_gpus": realized.use_gpus,
        "state_api": state is not None,
        "placement_groups": groups,
        "actors": actors,
        "pending_actors": pending,
    }


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
