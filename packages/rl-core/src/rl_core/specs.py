"""What the engines of a run start as: the config turned into genrm-serve ``InstanceSpec``s.

Pure: nothing here starts, probes or reads a model. The rollout engines are one instance of the
plan's engines (as large as the plan's, with its memory fraction), each judge instance keeps its
own spec with its plan's memory fraction, and an engine the plan puts to sleep reserves its host
buffers at start. ``rl_core.services`` starts what these describe.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from genrm_serve import EngineConfig, InstanceSpec
from rl_core.config import TrainConfig
from rl_core.participants import judge_id
from rl_core.placement import PlacementError
from rl_core.placement.sglang_flags import DETERMINISTIC_KEY

__all__ = ["judge_specs", "resolve_rollout_engine", "rollout_seeded", "rollout_spec"]


def resolve_rollout_engine(cfg: TrainConfig) -> str:
    """``--rollout-engine auto``: SGLang where it is installed and compute is on GPUs, else hf.

    The hf engine is one device: a layout that gives it more GPUs per engine is refused here,
    before anything starts (an explicit ``hf`` is refused by the plan already).
    """
    kind = cfg.layout.rollout_engine
    if kind == "auto":
        kind = "sglang" if cfg.device != "cpu" and importlib.util.find_spec("sglang") else "hf"
    per_engine = cfg.layout.rollout_num_gpus_per_engine
    if kind == "hf" and cfg.layout.rollout_server_args:
        raise PlacementError(
            f"--sglang-config / --sglang-* {sorted(cfg.layout.rollout_server_args)}: SGLang "
            "server arguments, but the rollout engine is hf (--rollout-engine sglang, or drop them)"
        )
    if kind == "hf" and per_engine > 1:
        raise PlacementError(
            f"--rollout-num-gpus-per-engine {per_engine}: SGLang is not installed here, and the "
            "hf rollout engine runs on one device (1 GPU per engine); install SGLang (see the "
            "genrm-serve README) or use --rollout-num-gpus-per-engine 1"
        )
    return kind


def _engine_spec(
    spec: InstanceSpec,
    device: str,
    mem_fraction_static: float | None = None,
    *,
    sleeps: bool = False,
) -> InstanceSpec:
    """The spec an engine starts with: ``--device cpu`` computes on CPU whatever bundle the
    engine sits in, the plan's memory fraction (e.g. defer-swap's default) is applied, and an
    engine the plan puts to sleep allocates its host buffers at start (so its first sleep is a
    copy, like every later one)."""
    update: dict[str, Any] = {}
    if device != "auto":
        update["device"] = device
    if mem_fraction_static is not None:
        update["mem_fraction_static"] = mem_fraction_static
    if sleeps:
        update["sleep_buffers"] = "start"
    if not update:
        return spec
    return spec.model_copy(update={"engine_config": spec.engine_config.model_copy(update=update)})


def rollout_seeded(cfg: TrainConfig, engine: str) -> bool:
    """Whether the rollout engines honour a per-sample sampling seed: hf always, SGLang only with
    deterministic inference (else it refuses a seeded request; an unseeded rollout is SGLang's
    and the original's default)."""
    return engine != "sglang" or bool(cfg.layout.rollout_server_args.get(DETERMINISTIC_KEY))


def rollout_spec(cfg: TrainConfig, policy_path: str, engine: str) -> InstanceSpec:
    """The rollout engines as genrm-serve sees them: an instance of the plan's engines."""
    plan = cfg.plan
    engines = plan.engines_of("rollout")
    per_engine = len(engines[0].bundles) if engines else 1
    server_args = dict(cfg.layout.rollout_server_args) if engine == "sglang" else {}
    deterministic = bool(server_args.pop(DETERMINISTIC_KEY, False))
    spec = InstanceSpec(
        route_key="rollout",
        model_path=policy_path,
        num_gpus=per_engine * max(len(engines), 1),
        num_gpus_per_engine=per_engine,
        engine=engine,
        engine_config=EngineConfig(
            max_batch_size=max(cfg.n_samples_per_prompt, 1) * 4,
            max_context_len=(cfg.rollout_max_prompt_len or 4096) + cfg.rollout_max_response_len,
            server_args=server_args,
            deterministic_inference=deterministic,
        ),
    )
    return _engine_spec(
        spec,
        cfg.device,
        engines[0].mem_fraction_static if engines else None,
        sleeps=plan.sleeps("rollout"),
    )


def judge_specs(cfg: TrainConfig) -> dict[str, InstanceSpec]:
    """The judge instances as their engines start: each with its plan's memory fraction."""
    plan = cfg.plan
    return {
        k: _engine_spec(
            s, cfg.device, plan.judges[k].mem_fraction_static, sleeps=plan.sleeps(judge_id(k))
        )
        for k, s in cfg.genrm_instances.items()
    }
