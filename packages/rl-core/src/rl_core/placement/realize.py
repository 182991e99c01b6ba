"""Putting a :class:`PlacementPlan` on a Ray cluster: placement groups, sorted bundles, actors.

Every plan group becomes one PACK placement group of ``{GPU: 1, CPU: 1}`` bundles. Ray numbers
bundles in no useful order, so a tiny probe task in each bundle reports its node and the GPU id
Ray gave it, and the bundles are sorted by (node, GPU id): the plan's logical bundle ``k`` is the
``k``-th of them, and an engine's bundles are contiguous GPUs of one node. Where an engine's
bundles really landed is checked against the plan (an engine that cannot span nodes must sit on
one) before any engine starts.

Roles that share a bundle (colocate) ask for fractions of its GPU (``COLOCATE_GPU_SHARE``), so
Ray lets the actor workers, rollout engines and judge engines meet there. An engine's actor sits
in its first bundle; a multi-GPU engine drives the other GPUs itself
(:meth:`RealizedPlacement.engine_gpu_ids` lists them), as SGLang does.

Waiting for a cluster that is still coming up is normal: the wait logs what it needs and what the
cluster has every ``log_interval_s`` instead of hanging silently, and gives up after
``timeout_s`` with the arithmetic. These functions block (``ray.get`` / ``ray.wait``): call them
from the driver, or through ``asyncio.to_thread`` from async code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from genrm_serve import InstanceSpec
from rl_core.limits import PLACEMENT_TIMEOUT_S, WAIT_WORD_EVERY_S
from rl_core.placement.errors import PlacementUnavailableError
from rl_core.placement.plan import EnginePlacement, GroupPlan, PlacementPlan

__all__ = [
    "BundleSlot",
    "RealizedPlacement",
    "create_engine_worker_in",
    "create_engine_workers",
    "create_judge_engines",
    "create_placement_groups",
    "place_engines",
    "shares_gpus",
]

logger = logging.getLogger(__name__)

#: What each probe task asks of its bundle (it ends before any real actor is placed).
_PROBE_SHARE = 0.01


@dataclass(frozen=True)
class BundleSlot:
    """Where one logical bundle of a group really is."""

    group: str
    index: int  # the plan's logical bundle index (after sorting)
    bundle_index: int  # Ray's index of the bundle inside the placement group
    node_id: str
    node_ip: str
    gpu_ids: tuple[str, ...]  # the GPU ids Ray assigns in this bundle (CUDA_VISIBLE_DEVICES)


@dataclass
class RealizedPlacement:
    """The plan's placement groups on Ray, with every logical bundle located."""

    plan: PlacementPlan
    placement_groups: dict[str, PlacementGroup]
    slots: dict[str, tuple[BundleSlot, ...]]
    use_gpus: bool = True
    _removed: bool = field(default=False, repr=False)

    def slot(self, group: str, index: int) -> BundleSlot:
        return self.slots[group][index]

    def strategy(self, group: str, index: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that puts an actor into logical bundle ``index`` of ``group``."""
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_groups[group],
            placement_group_bundle_index=self.slot(group, index).bundle_index,
        )

    def _options(self, group: str, index: int, share: float) -> dict[str, Any]:
        return {
            "scheduling_strategy": self.strategy(group, index),
            "num_gpus": share if self.use_gpus else 0,
            "num_cpus": share,
        }

    def worker_options(self, role: str, rank: int) -> dict[str, Any]:
        """``.options(**...)`` for worker ``rank`` of a role (one worker per bundle)."""
        rp = self.plan.roles[role]
        return self._options(rp.group, rp.bundles[rank], rp.gpu_fraction)

    def engine_options(self, engine: EnginePlacement) -> dict[str, Any]:
        """``.options(**...)`` for an engine's actor: its first bundle, its GPU share."""
        return self._options(engine.group, engine.bundles[0], engine.gpu_fraction)

    def engine_slots(self, engine: EnginePlacement) -> tuple[BundleSlot, ...]:
        return tuple(self.slot(engine.group, b) for b in engine.bundles)

    def engine_gpu_ids(self, engine: EnginePlacement) -> tuple[str, ...]:
        """Every GPU the engine drives, in order (its actor itself sees only the first)."""
        return tuple(g for s in self.engine_slots(engine) for g in s.gpu_ids)

    def intact(self) -> bool:
        """Whether every placement group still holds all its bundles (``CREATED``: none lost
        with a node, none being rescheduled); a GCS call each."""
        from ray.util.placement_group import placement_group_table

        return all(
            placement_group_table(pg).get("state") == "CREATED"
            for pg in self.placement_groups.values()
        )

    def remove(self) -> None:
        """Remove the placement groups (actors still inside them are killed by Ray)."""
        if self._removed:
            return
        for pg in self.placement_groups.values():
            remove_placement_group(pg)
        self._removed = True


@ray.remote(max_calls=0)  # reuse the process: Ray's default for GPU tasks is one per call
def _probe_bundle() -> tuple[str, str, list[str]]:
    ctx = ray.get_runtime_context()
    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return ctx.get_node_id(), ip, [str(g) for g in ray.get_gpu_ids()]


def _cluster_has(resource: str) -> tuple[float, float]:
    return (
        float(ray.cluster_resources().get(resource, 0.0)),  # type: ignore[no-untyped-call]
        float(ray.available_resources().get(resource, 0.0)),  # type: ignore[no-untyped-call]
    )


def _wait_ready(
    pg: PlacementGroup,
    group: GroupPlan,
    plan: PlacementPlan,
    deadline: float,
    log_every: float,
    use_gpus: bool,
) -> None:
    # what the wait says is the bundles' scarce resource: GPUs, or CPUs on a machine without
    start = time.monotonic()
    ref = pg.ready()
    unit, bundle = ("GPU", "{GPU: 1, CPU: 1}") if use_gpus else ("CPU", "{CPU: 1}")
    while True:
        remaining = deadline - time.monotonic()
        ready, _ = ray.wait([ref], timeout=max(0.0, min(log_every, remaining)))
        if ready:
            return
        total, free = _cluster_has(unit)
        waited = time.monotonic() - start
        if time.monotonic() >= deadline:
            raise PlacementUnavailableError(
                f'placement group "{group.name}" ({group.num_bundles} bundles of {bundle}, '
                f"PACK) not placed after {waited:.0f} s: the plan ({plan.mode}) needs "
                f"{plan.num_gpus} {unit}s in total; the cluster has {total:g} {unit}s, "
                f"{free:g} free. Add nodes, free {unit}s, or shrink --resource"
            )
        logger.warning(
            'waiting %.0f s for placement group "%s": needs %d %ss (%d for the whole plan); '
            "cluster has %g %ss, %g free",
            waited,
            group.name,
            group.num_bundles,
            unit,
            plan.num_gpus,
            total,
            unit,
            free,
        )


def _locate(
    pg: PlacementGroup, group: GroupPlan, use_gpus: bool, timeout_s: float
) -> tuple[BundleSlot, ...]:
    # Probe in rounds, one bundle per node per round: each node then needs one (reused) worker
    # process instead of one per bundle, which matters on small machines and big groups alike.
    table = placement_group_table(pg)
    by_node: dict[str, list[int]] = {}
    for index, node in sorted(table["bundles_to_node_id"].items()):
        by_node.setdefault(node, []).append(int(index))
    found: dict[int, tuple[str, str, list[str]]] = {}
    deadline = time.monotonic() + timeout_s
    for round_ in range(max(len(v) for v in by_node.values())):
        batch = [v[round_] for v in by_node.values() if round_ < len(v)]
        refs = [
            _probe_bundle.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i
                ),
                num_gpus=_PROBE_SHARE if use_gpus else 0,
                num_cpus=_PROBE_SHARE,
            ).remote()
            for i in batch
        ]
        try:
            results = ray.get(refs, timeout=max(1.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError as err:
            raise PlacementUnavailableError(
                f'placement group "{group.name}": probing its bundles took more than '
                f"{timeout_s:.0f} s"
            ) from err
        found.update(zip(batch, results, strict=True))

    def key(item: tuple[int, tuple[str, str, list[str]]]) -> tuple[str, str, int, str, int]:
        i, (node_id, ip, gpus) = item
        gpu = gpus[0] if gpus else ""
        return (ip, node_id, int(gpu) if gpu.isdigit() else -1, gpu, i)

    ordered = sorted(found.items(), key=key)
    slots = []
    for logical, (bundle_index, (node_id, ip, gpus)) in enumerate(ordered):
        if use_gpus and len(gpus) != 1:
            raise PlacementUnavailableError(
                f'placement group "{group.name}" bundle {bundle_index}: expected one GPU id, '
                f"Ray gave {gpus}"
            )
        slots.append(
            BundleSlot(
                group=group.name,
                index=logical,
                bundle_index=bundle_index,
                node_id=node_id,
                node_ip=ip,
                gpu_ids=tuple(gpus),
            )
        )
    return tuple(slots)


def _check_engines(realized: RealizedPlacement) -> None:
    plan = realized.plan
    for engine in plan.engines:
        nodes = {s.node_id for s in realized.engine_slots(engine)}
        if len(nodes) == 1:
            continue
        where = (
            f'{engine.name} (bundles {engine.bundles[0]}..{engine.bundles[-1]} of "{engine.group}")'
        )
        if not engine.may_span_nodes:
            raise PlacementUnavailableError(
                f"{where} landed on {len(nodes)} nodes, and this engine cannot span nodes; are "
                f"the nodes smaller than --num-gpus-per-node {plan.num_gpus_per_node}, or is "
                "another job holding GPUs?"
            )
        per_node = {n: 0 for n in nodes}
        for s in realized.engine_slots(engine):
            per_node[s.node_id] += 1
        if any(c != plan.num_gpus_per_node for c in per_node.values()):
            raise PlacementUnavailableError(
                f"{where} spans nodes unevenly ({sorted(per_node.values())} GPUs per node); an "
                f"engine across nodes must take whole nodes of {plan.num_gpus_per_node} GPUs"
            )


def create_placement_groups(
    plan: PlacementPlan,
    *,
    timeout_s: float = PLACEMENT_TIMEOUT_S,
    log_interval_s: float = WAIT_WORD_EVERY_S,
    use_gpus: bool = True,
) -> RealizedPlacement:
    """Create, wait for and locate the plan's placement groups on the connected Ray cluster.

    ``use_gpus=False`` makes ``{CPU: 1}`` bundles and GPU-free actors (a CPU-only machine).
    Raises :class:`PlacementUnavailableError` (after removing what it created) when the cluster
    cannot hold the plan within ``timeout_s`` or the bundles land where the plan cannot use them.
    """
    deadline = time.monotonic() + timeout_s
    bundle = {"GPU": 1.0, "CPU": 1.0} if use_gpus else {"CPU": 1.0}
    pgs: dict[str, PlacementGroup] = {}
    slots: dict[str, tuple[BundleSlot, ...]] = {}
    try:
        for group in plan.groups:
            pg = placement_group([dict(bundle) for _ in range(group.num_bundles)], strategy="PACK")
            pgs[group.name] = pg
            _wait_ready(pg, group, plan, deadline, log_interval_s, use_gpus)
            slots[group.name] = _locate(pg, group, use_gpus, max(1.0, deadline - time.monotonic()))
        realized = RealizedPlacement(
            plan=plan, placement_groups=pgs, slots=slots, use_gpus=use_gpus
        )
        _check_engines(realized)
    except BaseException:
        for pg in pgs.values():
            remove_placement_group(pg)
        raise
    for name, group_slots in slots.items():
        logger.info(
            'placement group "%s": %s',
            name,
            ", ".join(
                f"{s.index}→{s.node_ip}/{s.node_id[:8]}:gpu{','.join(s.gpu_ids)}"
                for s in group_slots
            ),
        )
    return realized


def shares_gpus(plan: PlacementPlan) -> bool:
    """Whether rollout and judge engines live on the same GPUs (their memory fractions matter)."""
    return plan.mode in ("colocate-shared", "colocate-defer-swap")


EngineFactory = Callable[[EnginePlacement, dict[str, Any]], Any]


def place_engines(
    realized: RealizedPlacement,
    role: str,
    factory: EngineFactory,
    *,
    instance: str | None = None,
) -> list[Any]:
    """Create the plan's engines of ``role`` (/ judge ``instance``) with ``factory(engine, opts)``.

    ``opts`` holds ``scheduling_strategy``, ``num_gpus`` and ``num_cpus`` for the engine's actor,
    plus ``placement_group`` and ``bundle_index`` (Ray's index of its first bundle).
    """
    handles = []
    for engine in realized.plan.engines_of(role, instance):
        opts = realized.engine_options(engine)
        opts["placement_group"] = realized.placement_groups[engine.group]
        opts["bundle_index"] = realized.slot(engine.group, engine.bundles[0]).bundle_index
        handles.append(factory(engine, opts))
    return handles


def create_engine_workers(
    realized: RealizedPlacement,
    role: str,
    spec: InstanceSpec,
    *,
    instance: str | None = None,
    name_prefix: str | None = None,
) -> list[Any]:
    """genrm-serve ``EngineWorker`` actors (created, not started) for the plan's engines of
    ``role`` / ``instance``, each in its first bundle with the plan's GPU share."""

    def make(engine: EnginePlacement, opts: dict[str, Any]) -> Any:
        name = None if name_prefix is None else f"{name_prefix}{engine.name}"
        return create_engine_worker_in(realized, engine, spec, name=name)

    return place_engines(realized, role, make, instance=instance)


def create_engine_worker_in(
    realized: RealizedPlacement, engine: EnginePlacement, spec: InstanceSpec, *, name: str | None
) -> Any:
    """One engine's ``EngineWorker`` actor (created, not started) in its first bundle with the
    plan's GPU share: at start-up, and again when a rollout engine is re-created."""
    from genrm_serve import create_engine_worker

    opts = realized.engine_options(engine)
    return create_engine_worker(
        spec,
        engine.index,
        placement_group=realized.placement_groups[engine.group],
        bundle_index=realized.slot(engine.group, engine.bundles[0]).bundle_index,
        num_gpus=opts["num_gpus"],
        num_cpus=opts["num_cpus"],
        name=name,
        shared_gpu=shares_gpus(realized.plan),
    )


def create_judge_engines(
    realized: RealizedPlacement,
    instances: Mapping[str, InstanceSpec],
    *,
    name_prefix: str | None = None,
) -> dict[str, list[Any]]:
    """The judge engines (genrm-serve's ``EngineWorker`` actors) in the bundles of the plan;
    with ``name_prefix``, named as the run's other actors are (``<prefix>genrm-<instance>-<i>``),
    so Ray's tools, and an operator, find them."""
    for key in instances:
        if key not in realized.plan.judges:
            raise KeyError(
                f"judge instance {key!r} is not in the plan ({list(realized.plan.judges)})"
            )
    return {
        key: create_engine_workers(realized, "genrm", spec, instance=key, name_prefix=name_prefix)
        for key, spec in instances.items()
    }
