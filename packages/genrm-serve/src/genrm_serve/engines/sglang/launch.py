"""How an SGLang engine is launched: ``sgl.Engine``'s server arguments from an instance's config,
its GPUs, and the Ray actor options it needs; and the checks of the server arguments a user passes
through (``engine_config.server_args``, rl-core's ``--sglang-config`` / ``--sglang-*``), before any
model loads.

Everything here is decided before SGLang starts, so that a bad size or key is refused with our
setting's name instead of failing inside SGLang's child process. Two checks, at two depths,
because SGLang is often not installed where a config is written:

- :func:`check_owned_server_args` needs no SGLang (nor torch): a key that GenRM sets itself (its
  GPUs, its memory fraction, the memory saver that sleep needs …) is refused with the name of our
  setting for it. It runs where the config is parsed (``EngineConfig``, ``rl-core plan``), on any
  machine.
- :func:`check_known_server_args` needs the installed SGLang's ``ServerArgs`` fields: an unknown
  key (a typo, or a key of another SGLang version) is refused with its closest matches. It runs
  in the engine's environment before ``sgl.Engine`` is built.

And one adjustment of SGLang's defaults that our settings force (:func:`prefill_graph_args`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import EngineError

__all__ = [
    "ENGINE_ENV",
    "OWNED_SERVER_ARGS",
    "SGLANG_INSTALL_HINT",
    "SGLangPlacement",
    "check_known_server_args",
    "check_owned_server_args",
    "device_kwargs",
    "engine_actor_options",
    "import_sglang_engine",
    "launch_server_args",
    "model_positions",
    "prefill_graph_args",
    "server_arg_fields",
    "sglang_engine_kwargs",
]

logger = logging.getLogger(__name__)

SGLANG_INSTALL_HINT = (
    "the 'sglang' engine needs SGLang (CUDA only), which pins its own torch / transformers "
    "and cannot share this workspace's environment: create a separate GPU environment with "
    "`pip install 'sglang>=0.5.20' genrm-serve` and point engine_config.python_executable at its "
    "python (see packages/genrm-serve/README.md, 'Engines'); or use engine 'hf'"
)

#: Environment of an SGLang engine actor. NOSET: Ray leaves CUDA_VISIBLE_DEVICES alone, so the
#: actor (placed in its first bundle) can drive the engine's other GPUs by ``base_gpu_id``.
ENGINE_ENV = {
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true",
}


@dataclass(frozen=True)
class SGLangPlacement:
    """Where one SGLang engine (or its share on one node) runs; from the caller's placement.

    ``base_gpu_id`` / ``gpu_id_step``: this node's GPUs are ``base + i * step`` (physical ids:
    the actor sees every GPU of the node). An engine larger than a node runs one actor per node
    with the same ``nnodes`` and ``dist_init_addr`` ("host:port" of node_rank 0) and its own
    ``node_rank``; only node_rank 0 serves requests.
    """

    base_gpu_id: int | None = None
    gpu_id_step: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None


def import_sglang_engine() -> Callable[..., Any]:
    """``sglang.Engine``, or an ImportError that says how to install it."""
    try:
        import sglang
    except ImportError as err:
        raise ImportError(f"{SGLANG_INSTALL_HINT} ({err})") from err
    engine_cls: Callable[..., Any] = sglang.Engine
    return engine_cls


def _where(spec: InstanceSpec) -> str:
    return f"genrm instance {spec.route_key!r} (engine 'sglang')"


def sglang_engine_kwargs(
    spec: InstanceSpec, *, model_path: str, seed: int | None = None
) -> dict[str, Any]:
    """Map an instance's config to ``sgl.Engine`` server arguments (pure; raises on bad sizes).

    ``tp_size = num_gpus_per_engine / pp_size`` (an engine owns exactly its GPUs). ``dp_size``
    means SGLang's data-parallel attention inside those GPUs and needs ``enable_dp_attention``:
    SGLang's plain ``dp_size`` would start replicas that need ``dp x tp`` GPUs, and replicas are
    already our engines (``num_gpus / num_gpus_per_engine``), so it is refused, never guessed.
    """
    cfg = spec.engine_config
    where = _where(spec)
    gpus = spec.num_gpus_per_engine
    if gpus % cfg.pp_size:
        raise EngineError(
            f"{where}: num_gpus_per_engine={gpus} must be a multiple of pp_size={cfg.pp_size}"
        )
    tp = gpus // cfg.pp_size
    if cfg.dp_size > 1 and not cfg.enable_dp_attention:
        raise EngineError(
            f"{where}: dp_size={cfg.dp_size} needs enable_dp_attention=true (SGLang's "
            "data-parallel attention inside the engine's GPUs); judge replicas are engines: "
            "raise num_gpus (num_gpus / num_gpus_per_engine engines) instead"
        )
    if cfg.enable_dp_attention and cfg.dp_size < 2:
        raise EngineError(f"{where}: enable_dp_attention=true needs dp_size > 1")
    if tp % cfg.dp_size:
        raise EngineError(
            f"{where}: dp_size={cfg.dp_size} must divide the tensor-parallel size {tp} "
            f"(num_gpus_per_engine / pp_size)"
        )
    if tp % cfg.ep_size:
        raise EngineError(
            f"{where}: ep_size={cfg.ep_size} must divide the tensor-parallel size {tp}"
        )
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "tp_size": tp,
        "pp_size": cfg.pp_size,
        "dp_size": cfg.dp_size,
        "ep_size": cfg.ep_size,
        "context_length": cfg.max_context_len,
        "enable_memory_saver": True,
        # a sleep that releases the weights must find them again (a judge's are never resent)
        "enable_weights_cpu_backup": not cfg.sleep_keeps_weights,
        # "auto" is bf16 on a GPU, as the hf engine reads it: SGLang's own "auto" loads a
        # float32 checkpoint as float16 (configs/model_config.py, seen on 0.5.17), and two
        # engines of one instance kind must compute alike.
        "dtype": "bfloat16" if cfg.dtype == "auto" else cfg.dtype,
    }
    if cfg.enable_dp_attention:
        kwargs["enable_dp_attention"] = True
    if cfg.deterministic_inference:
        kwargs["enable_deterministic_inference"] = True
    if cfg.mem_fraction_static is not None:
        kwargs["mem_fraction_static"] = cfg.mem_fraction_static
    if seed is not None:
        kwargs["random_seed"] = seed
    return kwargs


def device_kwargs(
    gpus_on_node: int,
    assigned: list[int],
    *,
    sees_all_gpus: bool,
    placement: SGLangPlacement | None = None,
) -> dict[str, Any]:
    """``base_gpu_id`` / ``gpu_id_step`` (+ multi-node keys) for this actor (pure).

    ``assigned``: the GPU ids Ray gave the actor. With ``sees_all_gpus`` (NOSET) they are
    physical ids: several must be evenly spaced; one is the first of the engine's consecutive
    GPUs (rl-core puts the actor in its first bundle, bundles sorted by GPU id, as slime does).
    Without it Ray renumbered the visible GPUs from 0, and the actor must see them all.
    """
    p = placement or SGLangPlacement()
    out: dict[str, Any] = {}
    if p.nnodes > 1:
        if not p.dist_init_addr:
            raise EngineError(f"an engine over nnodes={p.nnodes} needs dist_init_addr")
        if not 0 <= p.node_rank < p.nnodes:
            raise EngineError(f"node_rank={p.node_rank} must be in [0, {p.nnodes})")
        out.update(nnodes=p.nnodes, node_rank=p.node_rank, dist_init_addr=p.dist_init_addr)
    if p.base_gpu_id is not None:
        return {**out, "base_gpu_id": p.base_gpu_id, "gpu_id_step": p.gpu_id_step}
    ids = sorted(assigned)
    if not sees_all_gpus:
        if gpus_on_node > 1 and len(ids) < gpus_on_node:
            raise EngineError(
                f"the engine needs {gpus_on_node} GPUs on this node but its actor sees "
                f"{len(ids)} (CUDA_VISIBLE_DEVICES); create it with engine 'sglang' through "
                "create_engine_worker (which sets RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1) "
                "or give the actor all its GPUs"
            )
        return {**out, "base_gpu_id": 0, "gpu_id_step": 1}
    if not ids:
        return {**out, "base_gpu_id": 0, "gpu_id_step": 1}
    if len(ids) == 1 or len(ids) < gpus_on_node:
        return {**out, "base_gpu_id": ids[0], "gpu_id_step": 1}
    ids = ids[:gpus_on_node]
    step = ids[1] - ids[0]
    if any(b - a != step for a, b in itertools.pairwise(ids)):
        raise EngineError(
            f"the actor's GPUs {ids} are not evenly spaced; SGLang addresses an engine's GPUs "
            "as base_gpu_id + i * gpu_id_step: pass an SGLangPlacement"
        )
    return {**out, "base_gpu_id": ids[0], "gpu_id_step": step}


def engine_actor_options(spec: InstanceSpec, *, shared_gpu: bool = False) -> dict[str, Any]:
    """Ray actor options an engine of ``spec`` needs (``create_engine_worker`` merges them).

    ``python_executable`` → ``runtime_env.py_executable`` (any engine kind); an explicit
    ``sglang`` engine also gets :data:`ENGINE_ENV`. ``shared_gpu`` (the caller's layout puts
    another inference engine's memory on the same GPUs) without ``mem_fraction_static`` is
    refused here, before the actor exists: SGLang would take most of the GPU. A fractional Ray
    ``num_gpus`` alone says nothing (colocated roles all ask fractions as scheduling tokens).
    """
    cfg = spec.engine_config
    runtime_env: dict[str, Any] = {}
    if cfg.python_executable is not None:
        runtime_env["py_executable"] = cfg.python_executable
    if spec.engine == "sglang":
        runtime_env["env_vars"] = dict(ENGINE_ENV)
    if spec.engine == "sglang" and shared_gpu and cfg.mem_fraction_static is None:
        raise EngineError(
            f"{_where(spec)}: shares its GPUs with another engine but "
            "engine_config.mem_fraction_static is not set; set it (the fractions on one GPU "
            "must sum to at most 0.9)"
        )
    return {"runtime_env": runtime_env} if runtime_env else {}


def model_positions(model_dir: str) -> int | None:
    """``max_position_embeddings`` of a model folder's config.json (None if it has none)."""
    try:
        value = json.loads((Path(model_dir) / "config.json").read_text()).get(
            "max_position_embeddings"
        )
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def _assigned_gpus() -> list[int]:
    """GPU ids Ray gave this actor (none outside Ray)."""
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            return [int(g) for g in ray.get_gpu_ids()]
    return []


def launch_server_args(
    spec: InstanceSpec,
    engine_id: str,
    engine_cls: Any,
    model_path: str,
    placement: SGLangPlacement | None = None,
) -> dict[str, Any]:
    """``sgl.Engine``'s keyword arguments for engine ``engine_id`` of ``spec``: ours, then what
    our settings force on SGLang's defaults, then the user's ``engine_config.server_args``
    (checked against the installed SGLang first)."""
    args = sglang_engine_kwargs(spec, model_path=model_path)
    gpus_on_node = spec.num_gpus_per_engine // (placement.nnodes if placement else 1)
    noset = os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES") == "1"
    args.update(
        device_kwargs(
            max(1, gpus_on_node),
            _assigned_gpus(),
            sees_all_gpus=noset,
            placement=placement,
        )
    )
    positions = model_positions(model_path)
    if positions is not None and args["context_length"] > positions:
        # SGLang refuses a context_length over the model's own (model_config.py
        # _derive_context_length, seen on 0.5.17): our default (8192) or a rollout's prompt
        # + response room must not stop a 4096-position model from starting.
        logger.info(
            "engine %s: context_length %d capped at the model's max_position_embeddings %d",
            engine_id,
            args["context_length"],
            positions,
        )
        args["context_length"] = positions
    user = dict(spec.engine_config.server_args)
    fields = server_arg_fields(engine_cls)
    graphs_saved = os.environ.get("SGLANG_MEMORY_SAVER_CUDA_GRAPH") == "true"
    try:
        check_known_server_args(f"engine {engine_id}", user, fields)
        forced = prefill_graph_args(user, fields, graphs_in_memory_saver=graphs_saved)
    except ValueError as err:
        raise EngineError(str(err)) from None
    return {**args, **forced, **user}


_PLACEMENT = "the engine's placement (Ray gives each engine its GPUs)"

#: ``ServerArgs`` fields GenRM sets itself → the setting a user changes instead.
OWNED_SERVER_ARGS: dict[str, str] = {
    "model_path": "the instance's model_path (rl-core: --hf-checkpoint / --genrm-model-path)",
    "tokenizer_path": "the instance's model_path (prompts are tokenized from its folder)",
    "tp_size": "num_gpus_per_engine (rl-core: --rollout-num-gpus-per-engine)",
    "pp_size": "engine_config.pp_size",
    "dp_size": "engine_config.dp_size",
    "ep_size": "engine_config.ep_size",
    "enable_dp_attention": "engine_config.enable_dp_attention",
    "context_length": "engine_config.max_context_len (rl-core rollout: --rollout-max-prompt-len "
    "+ --rollout-max-response-len)",
    "mem_fraction_static": "engine_config.mem_fraction_static (rl-core rollout: "
    "--sglang-mem-fraction-static)",
    "enable_memory_saver": "nothing: always on, sleep / wake releases the engine's memory",
    "enable_weights_cpu_backup": "nothing: always on, a sleeping engine keeps its weights",
    "dtype": "engine_config.dtype",
    "random_seed": "the run's --seed",
    "enable_deterministic_inference": "engine_config.deterministic_inference",
    "base_gpu_id": _PLACEMENT,
    "gpu_id_step": _PLACEMENT,
    "nnodes": _PLACEMENT,
    "node_rank": _PLACEMENT,
    "dist_init_addr": _PLACEMENT,
}

#: Keys with which a user chooses the prefill CUDA graph themselves (SGLang 0.5.17).
_PREFILL_GRAPH_KEYS = (
    "cuda_graph_backend_prefill",
    "disable_prefill_cuda_graph",
    "cuda_graph_config",
)


def check_owned_server_args(where: str, server_args: Mapping[str, Any]) -> None:
    """Refuse keys that are not strings, and keys GenRM owns (naming our setting for each)."""
    bad = [k for k in server_args if not isinstance(k, str) or not k]
    if bad:
        raise ValueError(f"{where}: server_args keys must be non-empty strings, got {bad!r}")
    owned = [k for k in server_args if k in OWNED_SERVER_ARGS]
    if owned:
        parts = [f"{k!r} (value {server_args[k]!r}): set {OWNED_SERVER_ARGS[k]}" for k in owned]
        raise ValueError(f"{where}: server_args sets what GenRM sets itself: " + "; ".join(parts))


def server_arg_fields(engine_cls: Any = None) -> frozenset[str]:
    """The installed SGLang's ``ServerArgs`` field names (``engine_cls.SERVER_ARG_FIELDS`` when
    the engine class declares them: the test fake)."""
    declared = getattr(engine_cls, "SERVER_ARG_FIELDS", None)
    if declared is not None:
        return frozenset(declared)
    from sglang.srt.server_args import ServerArgs

    return frozenset(f.name for f in dataclasses.fields(ServerArgs))


def check_known_server_args(
    where: str, server_args: Mapping[str, Any], fields: Iterable[str]
) -> None:
    """Refuse keys the installed SGLang does not know, each with its closest matches."""
    known = frozenset(fields)
    parts = []
    for key in sorted(set(server_args) - known):
        close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
        hint = f" (closest: {', '.join(close)})" if close else ""
        parts.append(f"{key!r}{hint}")
    if parts:
        raise ValueError(
            f"{where}: server_args has key(s) the installed SGLang does not know: "
            + "; ".join(parts)
        )


def prefill_graph_args(
    server_args: Mapping[str, Any],
    fields: Iterable[str],
    *,
    graphs_in_memory_saver: bool,
) -> dict[str, Any]:
    """The prefill-graph setting our memory saver forces, or ``{}``.

    SGLang 0.5.17 captures "breakable" prefill CUDA graphs by default, and their constructor
    refuses the memory saver when CUDA graphs live inside it
    (``runner_backend/breakable_cuda_graph_backend.py``: "Breakable CUDA graph is not compatible
    with memory saver mode"), which kills the scheduler at start. Sleep needs the graphs inside
    the saver (``SGLANG_MEMORY_SAVER_CUDA_GRAPH``), so prefill graphs are switched off, unless
    the user chose a prefill graph backend themselves (then a breakable one is refused here,
    with why, instead of in SGLang's child process).
    """
    if not graphs_in_memory_saver or "cuda_graph_backend_prefill" not in set(fields):
        return {}
    chosen = server_args.get("cuda_graph_backend_prefill")
    if chosen == "breakable":
        raise ValueError(
            "server_args cuda_graph_backend_prefill='breakable': SGLang's breakable prefill "
            "CUDA graphs refuse the memory saver that sleep / wake needs; choose another "
            "prefill backend, or 'disabled'"
        )
    if any(k in server_args for k in _PREFILL_GRAPH_KEYS):
        return {}
    logger.info(
        "SGLang: prefill CUDA graphs off (cuda_graph_backend_prefill='disabled'): SGLang's "
        "default breakable prefill graphs refuse the memory saver that sleep / wake needs; "
        "decode graphs stay on. server_args cuda_graph_backend_prefill chooses another backend"
    )
    return {"cuda_graph_backend_prefill": "disabled"}
