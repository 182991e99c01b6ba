"""Where every role of a run really is: read from Ray's state API and from the workers.

Written to ``RUN_DIR/layout.json`` once everything is started, so a user (and the tests) can
check the run against its plan: every actor alive in the plan's placement group, with the plan's
GPU share, on the GPU of its bundle; nothing pending; no GPU held by two roles except through the
plan's fractional shares (:func:`layout_problems` says what is wrong, if anything).
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.placement.realize import RealizedPlacement

LAYOUT_FILE = "layout.json"


def _actor_id(handle: Any) -> str:
    return str(handle._actor_id.hex())


async def read_layout(
    realized: RealizedPlacement,
    trainer_groups: Mapping[str, Any],
    rollout_engines: Sequence[Any],
    judge_actors: Mapping[str, Sequence[Any]],
) -> dict[str, Any]:
    """Every actor of the plan: what the plan expects, what Ray's state API and the actor say."""
    from ray.util.placement_group import placement_group_table
    from ray.util.state import list_actors

    plan = realized.plan
    expected: dict[str, dict[str, Any]] = {}  # actor id → its plan entry and its own report
    for role, group in trainer_groups.items():
        rp = plan.roles[role]
        for rank, (worker, where) in enumerate(
            zip(group.workers, await group.where(), strict=True)
        ):
            slot = realized.slot(rp.group, rp.bundles[rank])
            expected[_actor_id(worker)] = {
                "role": role,
                "rank": rank,
                "group": rp.group,
                "bundle": rp.bundles[rank],
                "share": rp.gpu_fraction,
                "bundle_gpu_ids": list(slot.gpu_ids),
                "where": where,
            }
    engines = [
        ("rollout", e.actor, p)
        for e, p in zip(rollout_engines, plan.engines_of("rollout"), strict=True)
    ]
    for key, actors in judge_actors.items():
        engines += [
            ("genrm:" + key, a, p)
            for a, p in zip(actors, plan.engines_of("genrm", key), strict=True)
        ]
    infos = await asyncio.gather(*(a.info.remote() for _, a, _ in engines))
    for (role, actor, placement), info in zip(engines, infos, strict=True):
        slot = realized.slot(placement.group, placement.bundles[0])
        expected[_actor_id(actor)] = {
            "role": role,
            "rank": placement.index,
            "group": placement.group,
            "bundle": placement.bundles[0],
            "share": placement.gpu_fraction,
            "bundle_gpu_ids": list(slot.gpu_ids),
            "where": {
                "node_id": None,
                "gpu_ids": [str(g) for g in info.get("gpu_ids", [])],
                "cuda_visible_devices": info.get("cuda_visible_devices"),
                "placement_group_id": info.get("placement_group_id"),
            },
        }
    state = await asyncio.to_thread(
        list_actors, detail=True, limit=10_000, raise_on_missing_output=False
    )
    by_id = {a.actor_id: a for a in state}
    actors = []
    for actor_id, entry in expected.items():
        seen = by_id.get(actor_id)
        actors.append(
            {
                **entry,
                "actor_id": actor_id,
                "name": getattr(seen, "name", None),
                "state": getattr(seen, "state", "MISSING"),
                "node_id": getattr(seen, "node_id", None),
                "placement_group_id": getattr(seen, "placement_group_id", None),
                "required_resources": dict(getattr(seen, "required_resources", None) or {}),
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
    pending = [a.actor_id for a in state if a.state in ("PENDING_CREATION", "DEPENDENCIES_UNREADY")]
    return {
        "mode": plan.mode,
        "use_gpus": realized.use_gpus,
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
        if pg_ids.get(a["placement_group_id"]) != a["group"]:
            problems.append(
                f"{who} is in placement group {a['placement_group_id']}, the plan says {a['group']}"
            )
        gpu = float(a["required_resources"].get("GPU", 0.0))
        if layout["use_gpus"]:
            if abs(gpu - a["share"]) > 1e-9:
                problems.append(
                    f"{who} asked Ray for {gpu:g} GPU, the plan's share is {a['share']:g}"
                )
            seen = a["where"]["gpu_ids"]
            if seen != a["bundle_gpu_ids"]:
                problems.append(
                    f"{who} got GPU {seen}, its bundle {a['bundle']} is GPU {a['bundle_gpu_ids']}"
                )
            for g in seen:
                held[(str(a["node_id"]), g)].append((who, gpu))
        elif gpu:
            problems.append(f"{who} asked Ray for {gpu:g} GPU on a cluster without GPUs")
    for (node, gpu_id), holders in held.items():
        total = sum(share for _, share in holders)
        if total > 1.0 + 1e-9 or (len(holders) > 1 and any(share >= 1.0 for _, share in holders)):
            problems.append(f"GPU {gpu_id} of node {node[:8]} is held by {holders}")
    return problems
