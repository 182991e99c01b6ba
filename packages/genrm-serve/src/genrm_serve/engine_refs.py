"""Which engine actors serve an instance, and how to re-create one that died.

The service never assumes it created its engines. rl-core places judge engines into the bundles
of its own placement plan and hands the service an :class:`EngineRef` per engine (a handle or an
actor name, plus, optionally, where it lives so that the service may re-create it there). In
standalone mode the ingress makes one placement group per instance and builds the same refs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from genrm_serve.config import GenRMConfigError, InstanceSpec

__all__ = [
    "EnginePlacement",
    "EngineRef",
    "EngineSource",
    "engine_actor_name",
    "follower_refs",
    "instance_bundles",
    "needs_gpus",
    "normalize_engines",
]

logger = logging.getLogger(__name__)

#: What a caller may pass for one engine: a ref, an actor handle, or a named actor's name.
EngineSource = Any


@dataclass(frozen=True)
class EnginePlacement:
    """Where an engine actor is (re-)created: a bundle of a placement group, or anywhere."""

    placement_group: Any = None
    bundle_index: int | None = None
    num_gpus: float | None = None
    num_cpus: float | None = None


@dataclass
class EngineRef:
    """One engine actor of an instance.

    ``handle`` or ``name`` (looked up in ``namespace``; None = the caller's namespace when the
    ref came from a bare name) finds a running actor. With ``placement``
    given, the service re-creates the engine there when the actor dies (``ray.kill``, a crash);
    without it, the service waits for Ray to restart the actor (``max_restarts``) and rejoins it.
    In standalone mode ``handle`` starts as None and the service creates the actor itself.
    ``reattach``: another ingress replica (the leader, see ``ServeArgs.ingress_replicas``)
    creates and re-creates the actor under ``name``; this replica looks the name up again after
    the actor dies instead of waiting for Ray to restart it.
    """

    handle: Any = None
    name: str | None = None
    namespace: str | None = None
    placement: EnginePlacement | None = None
    #: Name under which a (re-)created actor is registered (``build_app`` gives one).
    create_name: str | None = None
    reattach: bool = False

    @property
    def recreatable(self) -> bool:
        return self.placement is not None


def normalize_engines(
    instances: Mapping[str, InstanceSpec],
    engines: Mapping[str, Sequence[EngineSource]] | None,
) -> dict[str, list[EngineRef]]:
    """Turn the caller's engines into refs; reject a route_key that no instance declares.

    A bare actor name is looked up in the caller's Ray namespace (the ingress runs in Serve's).
    """
    out: dict[str, list[EngineRef]] = {}
    namespace = _caller_namespace()
    for key, items in (engines or {}).items():
        if key not in instances:
            raise GenRMConfigError(
                f"engines given for route_key={key!r}, which is not a configured instance "
                f"(instances: {sorted(instances)})"
            )
        refs: list[EngineRef] = []
        for item in items:
            if isinstance(item, EngineRef):
                refs.append(item)
            elif isinstance(item, str):
                refs.append(EngineRef(name=item, namespace=namespace))
            else:
                refs.append(EngineRef(handle=item))
        if not refs:
            raise GenRMConfigError(f"engines for route_key={key!r}: the list is empty")
        if len(refs) != instances[key].num_engines:
            logger.warning(
                "route_key=%s: %d engine actors given, the spec implies %d "
                "(num_gpus / num_gpus_per_engine); serving with the actors given",
                key,
                len(refs),
                instances[key].num_engines,
            )
        out[key] = refs
    return out


def _caller_namespace() -> str | None:
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().namespace)
    except Exception:  # no Ray here: the name is looked up as given
        logger.debug("no Ray namespace to resolve actor names in", exc_info=True)
    return None


#: Engine kinds that never compute on a GPU (the deterministic test engine).
CPU_ONLY_ENGINES = frozenset({"scripted"})


def needs_gpus(spec: InstanceSpec, cluster_has_gpus: bool) -> bool:
    """Whether this instance's engines take GPUs: only on a cluster that has them, and only an
    engine that computes on one (not ``device: cpu``, not the scripted test engine)."""
    return (
        cluster_has_gpus
        and spec.engine_config.device != "cpu"
        and spec.engine not in CPU_ONLY_ENGINES
        and not spec.model_path.startswith("scripted")
    )


def instance_bundles(
    spec: InstanceSpec, *, with_gpus: bool, engine_num_cpus: float
) -> list[dict[str, float]]:
    """The placement-group bundles of one standalone instance: one per engine.

    ``with_gpus`` (:func:`needs_gpus`): each engine's bundle holds ``num_gpus_per_engine`` GPUs;
    otherwise the engines ask for none.
    """
    bundle: dict[str, float] = {"CPU": engine_num_cpus}
    if with_gpus:
        bundle["GPU"] = float(spec.num_gpus_per_engine)
    return [dict(bundle) for _ in range(spec.num_engines)]


def engine_actor_name(app_name: str, route_key: str, index: int) -> str:
    """The name the service gives an engine actor it creates (and re-creates)."""
    return f"genrm-engine:{app_name}:{route_key}:{index}"


def follower_refs(refs: Sequence[EngineRef]) -> list[EngineRef]:
    """The refs of an ingress replica other than the leader: the same actors, never created or
    killed here (one owner of every engine's life: the leader's supervisor). An engine the
    leader re-creates is found again under its ``create_name``."""
    out = []
    for ref in refs:
        if ref.recreatable:
            if ref.create_name is None:  # build_app gives every re-creatable engine one
                raise GenRMConfigError(
                    "a re-creatable engine needs a create_name when several ingress replicas "
                    "serve it (the others find the re-created actor by that name)"
                )
            out.append(EngineRef(handle=ref.handle, name=ref.create_name, reattach=True))
        else:
            out.append(
                EngineRef(
                    handle=ref.handle, name=ref.name, namespace=ref.namespace, reattach=ref.reattach
                )
            )
    return out
