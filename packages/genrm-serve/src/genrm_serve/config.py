"""Judge instance configuration: one parser for the standalone service and for rl-core.

Turns ``--genrm-instances`` JSON, or the legacy single-judge flags, into one validated mapping
``{route_key: InstanceSpec}``. Every invalid input is rejected here, before Ray or a model starts,
with a message naming the instance, the key, the value and the rule: the original silently dropped
unknown keys (even its own ``max_context_len``), which is how a judge ends up with a 4k context
nobody asked for.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from genrm_client.types import DEFAULT_ROUTE_KEY, SamplingParams

__all__ = [
    "DEFAULT_SAMPLING",
    "ENGINE_KINDS",
    "EngineConfig",
    "GenRMConfigError",
    "InstanceSpec",
    "add_genrm_args",
    "build_instances",
    "instances_from_args",
    "parse_json_flag",
]

logger = logging.getLogger(__name__)

#: Engine kinds an instance may ask for. ``auto``: SGLang when a GPU and SGLang are present, else
#: the embedded transformers engine.
ENGINE_KINDS: tuple[str, ...] = ("auto", "hf", "sglang", "scripted")

#: The judge's sampling defaults (SPEC.md §3): near-greedy, long enough for a thinking judge.
DEFAULT_SAMPLING = SamplingParams(
    temperature=0.1, top_p=1.0, top_k=-1, max_response_len=4096, chat_template_kwargs={}
)

_INSTANCE_KEYS = frozenset(
    {"model_path", "num_gpus", "num_gpus_per_engine", "engine", "engine_config", "sampling_config"}
)


class GenRMConfigError(ValueError):
    """An invalid GenRM configuration; the message names instance, key, value and rule."""


class EngineConfig(BaseModel):
    """Engine settings of one instance (``--genrm-engine-config`` / ``engine_config``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_context_len: int = Field(default=8192, gt=0)
    dp_size: int = Field(default=1, gt=0)
    pp_size: int = Field(default=1, gt=0)
    ep_size: int = Field(default=1, gt=0)
    #: Fraction of each GPU the engine may take; None = the engine's own default.
    mem_fraction_static: float | None = Field(default=None, gt=0.0, lt=1.0)
    #: hf engine on a GPU: when the host buffers that a sleeping engine's weights move to are
    #: allocated and pinned. "first_sleep": then (an engine that never sleeps holds no host
    #: copy; the first sleep pays the pinning, seconds for a few GB). "start": right after the
    #: weights load, so every sleep is a copy only (what a colocated engine wants).
    sleep_buffers: Literal["first_sleep", "start"] = "first_sleep"
    #: A GPU engine's sleep frees its KV cache (and SGLang's CUDA graphs) but keeps the weights
    #: on the GPU: no weight copy at sleep or wake, their memory stays taken. For a colocated
    #: judge, whose weights never change: SGLang copies a sleeping engine's weights to pageable
    #: host memory at every sleep (2.8 s for a 4B judge on an H200, 2026-12-03).
    sleep_keeps_weights: bool = False
    #: Before a sleep (once per weight version) and after every wake, the engine runs one fixed
    #: greedy probe of 16 tokens and compares the two: a wake that restored other weights fails
    #: and marks the engine failed, rather than letting it judge with them
    #: (``engines/wake_check.py``). Costs a 1-token prefill at each: milliseconds.
    wake_check: bool = True
    #: Largest number of requests the engine batches into one forward pass.
    max_batch_size: int = Field(default=32, gt=0)
    #: How long the engine's micro-batcher waits for the next request once it holds one (ms):
    #: each arrival within it restarts the wait, so a burst of single requests (a client's
    #: concurrent /generate) goes into one batch rather than a first batch of the few that came
    #: first with the rest queued behind it.
    batch_wait_ms: float = Field(default=2.0, ge=0.0)
    #: The longest the micro-batcher waits from a batch's first request, however requests keep
    #: coming (ms); at least ``batch_wait_ms``. Requests sent together (``generate_batch``, a
    #: reward's group) never wait: they arrive as one.
    batch_wait_max_ms: float = Field(default=2.0, ge=0.0)
    #: Requests waiting per instance beyond which the service answers 429.
    max_queued_requests: int = Field(default=256, gt=0)
    #: Weights' dtype; "auto" = bfloat16 on GPU and on a CPU with native bf16, else float32.
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    #: Where the engine runs; "auto" = CUDA when the engine's actor was given a GPU.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    #: sglang: data-parallel *attention* inside one engine's GPUs (needs dp_size > 1). Replicas
    #: of a judge are separate engines (num_gpus / num_gpus_per_engine), never SGLang's own DP.
    enable_dp_attention: bool = False
    #: sglang: batch-invariant kernels (``enable_deterministic_inference``); the only mode in
    #: which SGLang honours a request's ``seed``. Slower, and limited to some attention backends.
    deterministic_inference: bool = False
    #: hf engine: a LoRA adapter folder (peft's layout) merged into the weights at load, so a
    #: judge costs what its base costs. None: the shipped judge adapter when model_path is
    #: ``embedded`` (the embedded base is no judge without it), no adapter otherwise.
    #: ``"none"``: the bare base model.
    adapter_path: str | None = Field(default=None, min_length=1)
    #: Python interpreter of the engine actors (Ray ``runtime_env.py_executable``): an SGLang
    #: environment beside the driver's, since SGLang pins its own torch. None = the driver's.
    python_executable: str | None = Field(default=None, min_length=1)
    #: sglang: more ``sgl.Engine`` server arguments, passed as given (attention backend, CUDA
    #: graphs, chunked prefill …). Keys GenRM sets itself are refused here, naming our setting;
    #: keys the installed SGLang does not know are refused when the engine starts, before the
    #: model loads (``engines/sglang/launch.py``).
    server_args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("server_args")
    @classmethod
    def _server_args_not_ours(cls, value: dict[str, Any]) -> dict[str, Any]:
        from genrm_serve.engines.sglang.launch import check_owned_server_args

        check_owned_server_args("engine_config", value)
        return value

    @model_validator(mode="after")
    def _waits_ordered(self) -> EngineConfig:
        if self.batch_wait_max_ms < self.batch_wait_ms:
            raise ValueError(
                f"batch_wait_max_ms={self.batch_wait_max_ms} is below batch_wait_ms="
                f"{self.batch_wait_ms}: the longest wait from a batch's first request must be at "
                "least the wait for the next one"
            )
        return self


class InstanceSpec(BaseModel):
    """One judge instance: a route_key served by ``num_gpus / num_gpus_per_engine`` engines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    route_key: str = Field(min_length=1)
    model_path: str = Field(min_length=1)
    num_gpus: int = Field(gt=0)
    num_gpus_per_engine: int = Field(default=1, gt=0)
    engine: str = "auto"
    engine_config: EngineConfig = EngineConfig()
    sampling_config: SamplingParams = DEFAULT_SAMPLING

    @property
    def num_engines(self) -> int:
        return self.num_gpus // self.num_gpus_per_engine


def invalid_json(err: json.JSONDecodeError) -> str:
    """Where a JSON text went wrong, as every JSON flag and file of GenRM's says it."""
    return f"invalid JSON at line {err.lineno} column {err.colno} (char {err.pos}): {err.msg}"


def parse_json_flag(flag: str, value: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Parse a JSON object flag; errors name the flag and the position of the mistake."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise GenRMConfigError(f"{flag}: {invalid_json(err)}; value was {value!r}") from err
    if not isinstance(parsed, dict):
        raise GenRMConfigError(
            f"{flag}: must be a JSON object, got {type(parsed).__name__}: {value!r}"
        )
    return parsed


def _where(route_key: str) -> str:
    return f"genrm instance {route_key!r}"


def _positive_int(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GenRMConfigError(f"{where}: {key}={value!r} must be an integer")
    if value <= 0:
        raise GenRMConfigError(f"{where}: {key}={value} must be a positive integer")
    return value


def _validation_message(where: str, section: str, err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown {section} key {key!r} (value {e['input']!r})")
        else:
            parts.append(f"{section} key {key!r}={e.get('input')!r}: {e['msg']}")
    return f"{where}: " + "; ".join(parts)


def _section(
    where: str, section: str, base: dict[str, Any] | None, override: Any
) -> dict[str, Any]:
    if override is not None and not isinstance(override, Mapping):
        raise GenRMConfigError(f"{where}: {section} must be a JSON object, got {override!r}")
    return {**(base or {}), **(override or {})}


def _build_one(
    route_key: str,
    raw: Any,
    *,
    engine_config: dict[str, Any] | None,
    sampling_config: dict[str, Any] | None,
    engine: str,
) -> InstanceSpec:
    where = _where(route_key)
    if not isinstance(route_key, str) or not route_key.strip():
        raise GenRMConfigError(f"genrm instances: route_key {route_key!r} must be non-empty")
    if not isinstance(raw, Mapping):
        raise GenRMConfigError(f"{where}: must be a JSON object, got {raw!r}")
    unknown = sorted(set(raw) - _INSTANCE_KEYS)
    if unknown:
        raise GenRMConfigError(
            f"{where}: unknown key(s) {unknown}; allowed: {sorted(_INSTANCE_KEYS)}"
        )
    for key in ("model_path", "num_gpus"):
        if key not in raw:
            raise GenRMConfigError(f"{where}: missing required key {key!r}")
    model_path = raw["model_path"]
    if not isinstance(model_path, str) or not model_path.strip():
        raise GenRMConfigError(f"{where}: model_path={model_path!r} must be a non-empty string")
    num_gpus = _positive_int(where, "num_gpus", raw["num_gpus"])
    per_engine = _positive_int(where, "num_gpus_per_engine", raw.get("num_gpus_per_engine", 1))
    if num_gpus % per_engine:
        raise GenRMConfigError(
            f"{where}: num_gpus={num_gpus} must be a multiple of num_gpus_per_engine={per_engine}"
        )
    kind = raw.get("engine", engine)
    if kind not in ENGINE_KINDS:
        raise GenRMConfigError(f"{where}: engine={kind!r} is not one of {list(ENGINE_KINDS)}")
    ec = _section(where, "engine_config", engine_config, raw.get("engine_config"))
    sc = _section(where, "sampling_config", sampling_config, raw.get("sampling_config"))
    try:
        engine_cfg = EngineConfig.model_validate(ec)
    except ValidationError as err:
        raise GenRMConfigError(_validation_message(where, "engine_config", err)) from None
    try:
        sampling = SamplingParams.model_validate(sc).merged_over(DEFAULT_SAMPLING)
    except ValidationError as err:
        raise GenRMConfigError(_validation_message(where, "sampling_config", err)) from None
    return InstanceSpec(
        route_key=route_key,
        model_path=model_path,
        num_gpus=num_gpus,
        num_gpus_per_engine=per_engine,
        engine=kind,
        engine_config=engine_cfg,
        sampling_config=sampling,
    )


def build_instances(
    *,
    instances: str | Mapping[str, Any] | None = None,
    model_path: str | None = None,
    num_gpus: int = 1,
    num_gpus_per_engine: int = 1,
    engine_config: str | Mapping[str, Any] | None = None,
    sampling_config: str | Mapping[str, Any] | None = None,
    engine: str = "auto",
) -> dict[str, InstanceSpec]:
    """Validate the GenRM flags into ``{route_key: InstanceSpec}`` (empty: GenRM disabled).

    ``instances`` wins over the legacy ``model_path`` flags (with a warning when both are given);
    the global engine / sampling configs are the defaults each instance's own configs override.
    """
    inst = parse_json_flag("--genrm-instances", instances)
    ec = parse_json_flag("--genrm-engine-config", engine_config)
    sc = parse_json_flag("--genrm-sampling-config", sampling_config)
    if inst is not None:
        if model_path is not None:
            logger.warning(
                "both --genrm-instances and --genrm-model-path are set: using --genrm-instances "
                "(%s) and ignoring --genrm-model-path=%s",
                ", ".join(inst),
                model_path,
            )
        if not inst:
            raise GenRMConfigError("--genrm-instances: must configure at least one instance")
        return {
            key: _build_one(key, raw, engine_config=ec, sampling_config=sc, engine=engine)
            for key, raw in inst.items()
        }
    if model_path is None:
        return {}
    legacy = {
        "model_path": model_path,
        "num_gpus": num_gpus,
        "num_gpus_per_engine": num_gpus_per_engine,
    }
    spec = _build_one(
        DEFAULT_ROUTE_KEY, legacy, engine_config=ec, sampling_config=sc, engine=engine
    )
    return {DEFAULT_ROUTE_KEY: spec}


def add_genrm_args(parser: argparse.ArgumentParser) -> None:
    """Add the GenRM flags (the same in ``genrm-serve run`` and ``rl-core train``)."""
    g = parser.add_argument_group("GenRM judge")
    g.add_argument("--genrm-model-path", default=None, help="judge model (legacy single instance)")
    g.add_argument("--genrm-num-gpus", type=int, default=1, help="GPUs for the legacy instance")
    g.add_argument(
        "--genrm-num-gpus-per-engine", type=int, default=1, help="GPUs per engine (TP size)"
    )
    g.add_argument(
        "--genrm-engine-config",
        default=None,
        help="JSON: max_context_len, dp_size, pp_size, ep_size, mem_fraction_static, ...",
    )
    g.add_argument(
        "--genrm-sampling-config",
        default=None,
        help="JSON: temperature, top_p, top_k, max_response_len, stop, chat_template_kwargs, seed",
    )
    g.add_argument(
        "--genrm-instances",
        default=None,
        help='JSON {route_key: {"model_path", "num_gpus", "num_gpus_per_engine"?, "engine"?, '
        '"engine_config"?, "sampling_config"?}}; wins over --genrm-model-path',
    )
    g.add_argument(
        "--genrm-engine", default="auto", choices=ENGINE_KINDS, help="default engine kind"
    )


def instances_from_args(
    args: argparse.Namespace, *, num_gpus: int | None = None
) -> dict[str, InstanceSpec]:
    """``build_instances`` over the flags that :func:`add_genrm_args` added.

    ``num_gpus``, when given, replaces ``--genrm-num-gpus`` (a caller that derives its own
    default, e.g. from a placement plan).
    """
    return build_instances(
        instances=args.genrm_instances,
        model_path=args.genrm_model_path,
        num_gpus=args.genrm_num_gpus if num_gpus is None else num_gpus,
        num_gpus_per_engine=args.genrm_num_gpus_per_engine,
        engine_config=args.genrm_engine_config,
        sampling_config=args.genrm_sampling_config,
        engine=args.genrm_engine,
    )
