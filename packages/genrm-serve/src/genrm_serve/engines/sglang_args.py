"""SGLang server arguments a user passes through (``engine_config.server_args``, rl-core's
``--sglang-config`` / ``--sglang-*``), checked before any model loads.

Two checks, at two depths, because SGLang is often not installed where a config is written:

- :func:`check_owned_server_args` needs nothing but this module: a key that GenRM sets itself
  (its GPUs, its memory fraction, the memory saver that sleep needs …) is refused with the name
  of our setting for it. It runs where the config is parsed (``EngineConfig``, ``rl-core plan``),
  on any machine.
- :func:`check_known_server_args` needs the installed SGLang's ``ServerArgs`` fields: an unknown
  key (a typo, or a key of another SGLang version) is refused with its closest matches. It runs
  in the engine's environment before ``sgl.Engine`` is built.

And one adjustment of SGLang's defaults that our settings force (:func:`prefill_graph_args`).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "OWNED_SERVER_ARGS",
    "check_known_server_args",
    "check_owned_server_args",
    "prefill_graph_args",
    "server_arg_fields",
]

logger = logging.getLogger(__name__)

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
