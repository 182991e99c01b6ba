"""Will it ever fit? What a deployment needs, against what the Ray cluster has *in total*.

A placement group that asks for more than the cluster has waits forever (Ray reports it as
pending, and ``genrm-serve run`` waited its full ready timeout). That is decided before
anything is deployed, from totals (``ray.cluster_resources()``), not from what is free now: busy
resources free up, missing ones never appear. The comparison is pure so that rl-core can check
its own roles with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from genrm_serve.config import GenRMConfigError, InstanceSpec
from genrm_serve.engine_refs import instance_bundles, needs_gpus
from genrm_serve.serve_args import ServeArgs

__all__ = [
    "CapacityError",
    "check_fits",
    "check_service_fits",
    "cluster_capacity",
    "standalone_needs",
    "sum_resources",
]

#: Rounding slack: Ray keeps fractional resources in units of 1e-4.
_EPS = 1e-6


class CapacityError(GenRMConfigError):
    """What is asked for can never be placed on this cluster; the message has the numbers."""


def _num(x: float) -> str:
    return f"{x:g}"


def sum_resources(bundles: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Resource-wise sum of bundles (``{"CPU": 1, "GPU": 1}`` ...)."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0.0) + float(amount)
    return total


def check_fits(
    needed: Mapping[str, float], total: Mapping[str, float], what: str, *, hint: str = ""
) -> None:
    """Raise ``CapacityError`` naming every resource of ``needed`` that ``total`` cannot hold.

    Args:
        needed: resource → amount asked for (e.g. every bundle of a deployment, summed).
        total: resource → amount the cluster has in total (``ray.cluster_resources()``), or one
            node's resources when ``needed`` is a single bundle (a bundle never spans nodes).
        what: what asks, for the message ("the GenRM instances", "one engine of 'q'").
        hint: what the user can change, appended to the message.
    """
    short = [
        f"{name}: needs {_num(amount)}, the cluster has {_num(float(total.get(name, 0.0)))}"
        for name, amount in sorted(needed.items())
        if amount > float(total.get(name, 0.0)) + _EPS
    ]
    if short:
        message = f"{what} can never be placed: " + "; ".join(short)
        raise CapacityError(message + (f". {hint}" if hint else ""))


def standalone_needs(
    instances: Mapping[str, InstanceSpec],
    *,
    cluster_has_gpus: bool,
    engine_num_cpus: float,
    ingress_num_cpus: float,
) -> tuple[dict[str, list[dict[str, float]]], dict[str, float]]:
    """What ``genrm-serve run`` asks Ray for: each instance's bundles, and the sum of everything.

    An instance asks for GPUs by the same rule its engines do (:func:`needs_gpus`: a CPU or
    scripted engine takes none, also on a cluster that has GPUs). The sum includes the ingress
    replicas' CPUs (Serve's controller and proxy ask for none).
    """
    per_instance = {
        key: instance_bundles(
            spec,
            with_gpus=needs_gpus(spec, cluster_has_gpus),
            engine_num_cpus=engine_num_cpus,
        )
        for key, spec in instances.items()
    }
    total = sum_resources(b for bundles in per_instance.values() for b in bundles)
    total["CPU"] = total.get("CPU", 0.0) + ingress_num_cpus
    return per_instance, total


def cluster_capacity() -> tuple[dict[str, float], dict[str, float]]:
    """The connected cluster's totals, and the most of each resource one live node has (a
    bundle never spans nodes)."""
    import ray

    total = {k: float(v) for k, v in ray.cluster_resources().items()}  # type: ignore[no-untyped-call]
    node_max: dict[str, float] = {}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("Alive"):
            for name, amount in node.get("Resources", {}).items():
                node_max[name] = max(node_max.get(name, 0.0), float(amount))
    return total, node_max


def check_service_fits(
    instances: Mapping[str, InstanceSpec],
    args: ServeArgs,
    total: Mapping[str, float],
    node_max: Mapping[str, float],
    *,
    reserved: Mapping[str, float] | None = None,
) -> None:
    """Raise ``CapacityError`` when the service can never be placed: the one check of both ways
    in (``genrm-serve run``, and a caller that embeds the service).

    Standalone (``reserved`` None): every instance's engine bundles plus the ingress replicas'
    CPUs, against the cluster's totals (and one engine against the largest node). Embedded
    (``reserved``: what the caller's own placement groups hold, its engines inside them): only
    what the service asks outside those groups (the ingress replicas' CPUs), against the totals
    less ``reserved``. Without this, an ingress replica that does not fit waits unscheduled and
    the deploy never returns.
    """
    ingress = args.ingress_num_cpus * args.ingress_replicas
    if reserved is not None:
        left = {k: float(v) - float(reserved.get(k, 0.0)) for k, v in total.items()}
        held = ", ".join(f"{k}: {_num(float(v))}" for k, v in sorted(reserved.items()))
        check_fits(
            {"CPU": ingress},
            left,
            f"the GenRM service's ingress ({args.ingress_replicas} replica(s) x "
            f"{_num(args.ingress_num_cpus)} CPU, outside the placement groups, which hold "
            f"{held} of the cluster's CPU: {_num(float(total.get('CPU', 0.0)))})",
            hint="give the cluster more CPUs, or fewer bundles (--resource)",
        )
        return
    per_instance, needed = standalone_needs(
        instances,
        cluster_has_gpus=total.get("GPU", 0.0) > 0,
        engine_num_cpus=args.engine_num_cpus,
        ingress_num_cpus=ingress,
    )
    asks = ", ".join(
        f"{key!r}: {len(bundles)} engine(s) x {bundles[0] if bundles else {}}"
        for key, bundles in per_instance.items()
    )
    if needed.get("GPU", 0.0) > 0:
        hint = (
            "Lower the instances' num_gpus (one engine per num_gpus_per_engine GPUs) or join a "
            "cluster with more GPUs ($RAY_ADDRESS)"
        )
    else:
        hint = (
            f"Lower --engine-num-cpus (now {args.engine_num_cpus:g}, CPUs reserved per engine), "
            "give the local Ray more with --num-cpus, or lower the instances' num_gpus (each "
            "num_gpus_per_engine GPUs is one engine, also on a CPU-only cluster)"
        )
    for key, bundles in per_instance.items():
        if bundles:
            check_fits(bundles[0], node_max, f"one engine of instance {key!r}", hint=hint)
    check_fits(
        needed,
        total,
        f"the GenRM instances ({asks}, plus {ingress:g} CPU for the ingress)",
        hint=hint,
    )
