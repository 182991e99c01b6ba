"""The production GPU engine: SGLang's in-process ``sgl.Engine`` inside the engine's Ray actor.

SGLang pins its own torch and transformers, which clash with this workspace's lock, and needs
CUDA; so it is imported lazily, only when an ``sglang`` engine starts, and lives in a separate
environment (``engine_config.python_executable``, see the package README). Written against
SGLang's source (``python/sglang/srt``, main branch of 2026, 0.5.x API); where a behaviour below
names an SGLang file, that is the file it follows.

Threading. ``sgl.Engine.__init__`` adopts the running event loop of its thread or makes one
(``entrypoints/engine.py: Engine.__init__``), its sync methods drive that loop with
``run_until_complete`` (which fails inside a running loop, e.g. a Ray actor's), and
``async_generate`` must run on that same loop (``managers/tokenizer_manager.py`` binds its
response loop to it). So one private thread owns the engine and its loop: the loop runs forever
and takes every ``async_generate`` concurrently, so SGLang's continuous batching sees every
request in flight (not one synchronous batch at a time; the worker in front still sends one batch
of up to ``max_batch_size`` at a time); a sync control call (flush, release,
resume, weight updates, server info) stops the loop, runs on the thread, then the loop resumes.

Behaviours taken from SGLang's source (each is a test in ``tests/test_engine_sglang*.py``):

- Sleep keeps a judge's weights: ``enable_weights_cpu_backup`` (without it,
  ``release_memory_occupation(["weights"])`` frees the pages and resume maps fresh, uninitialised
  ones: ``managers/scheduler_update_weights_mixin.py``; SGLang issues #6367, #19442).
- ``flush_cache`` answers ``success=False`` while requests are pending, and release asserts the
  scheduler is idle (it dies otherwise): the flush is retried until it succeeds, under
  ``FLUSH_DEADLINE_S``.
- Sleep releases weights, KV cache and CUDA graphs (``cuda_graph`` tag; graphs are inside the
  memory saver only with ``SGLANG_MEMORY_SAVER_CUDA_GRAPH=true``,
  ``utils/torch_memory_saver_adapter.py``, as slime sets it).
- Context limits come from ``get_server_info()`` after start: SGLang refuses a prompt
  ``>= context_len`` and prompt + ``max_new_tokens > context_len`` with a ``ValueError``
  (``tokenizer_manager._validate_one_request``), and its scheduler aborts a prompt of
  ``max_req_input_len = max_req_len - 5`` tokens *or more* (``managers/utils.py:
  validate_input_length``; seen on 0.5.17). We refuse both per request as
  :class:`PromptTooLongError` (HTTP 413) and cap ``max_new_tokens``.
- Start-up: SGLang's defaults, except where our settings forbid one (``sglang_args.py``: the
  breakable prefill CUDA graphs of 0.5.17 refuse the memory saver, so prefill graphs go off,
  logged), then ``engine_config.server_args`` as given, unknown keys refused before the model
  loads. A scheduler that dies while loading SIGQUITs this process: the guard is installed
  before SGLang starts, and the :class:`EngineError` carries the last lines SGLang's processes
  wrote to stderr (``output_tail.py``), where its traceback is.
- Weights from a trainer on the same GPU: its CUDA IPC buckets go to SGLang's scheduler
  unopened (``sglang_weights.py``). From a trainer on other GPUs: SGLang's schedulers join the
  trainer's weight-broadcast group, one rank per TP rank, and receive each flat bucket as one
  broadcast of its bytes (``sglang_weights.py``, ``weights.py`` ``WeightBroadcastGroup``).
- Any other per-request SGLang error stays with its request (:class:`EngineBatchError`).
- ``top_k <= 0`` is sent as -1 (SGLang raises on 0: ``sampling/sampling_params.py: verify``).
- A request's ``seed`` is SGLang's ``sampling_seed``, honoured only with
  ``enable_deterministic_inference`` (``engine_config.deterministic_inference``); without it a
  sampled (temperature > 0) request with a seed is refused, never silently unseeded.
- Multi-GPU engines: ``base_gpu_id`` / ``gpu_id_step`` from the GPUs Ray gave the actor, which
  sees every GPU of its node (``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``, as slime does);
  ``nnodes`` / ``node_rank`` / ``dist_init_addr`` from an explicit :class:`SGLangPlacement`.
- A failing SGLang child sends SIGQUIT to its parent (``scheduler.py: run_scheduler_process``;
  a hung forward does too, ``utils/watchdog.py: ProcessWatchdog``; and SGLang's
  ``SubprocessWatchdog`` SIGQUITs this process when a child dies), whose default action kills the
  actor silently; SGLang installs its own handler only on the main thread. We install one (main
  thread: marks the engine failed; elsewhere, e.g. a Ray async actor where ``signal.signal``
  refuses, SIGQUIT is ignored) and watch the children: a dead one marks the engine failed and
  fails its requests with the exit code; a hung one fails the health probe.
- ``mem_fraction_static`` is passed as given; ``create_engine_worker(..., shared_gpu=True)``
  refuses an SGLang engine without it (the layout's owner says whether GPUs are shared).
- ``configure_logger`` calls ``logging.basicConfig(force=True)`` (``utils``): the root
  logger's handlers and level are put back after start.
- Health probes a one-token generation under ``HEALTH_PROBE_TIMEOUT_S`` (a hung scheduler is
  unhealthy), unless an output arrived within that window (SGLang's ``/health_generate`` does the
  same).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import itertools
import logging
import math
import multiprocessing
import os
import queue
import signal
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from genrm_client.types import FinishReason, SamplingParams
from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineBatchError,
    EngineError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.output_tail import OutputTail
from genrm_serve.engines.prefix_tree import build_forest, common_prefix_len
from genrm_serve.engines.prompts import PromptEncoder
from genrm_serve.engines.sglang_args import (
    check_known_server_args,
    prefill_graph_args,
    server_arg_fields,
)
from genrm_serve.engines.wake_check import WakeCheck
from genrm_serve.engines.weights import BucketMeta

__all__ = [
    "ENGINE_ENV",
    "MEMORY_TAGS",
    "SGLANG_INSTALL_HINT",
    "SGLangEngine",
    "SGLangPlacement",
    "SGLangPromptTooLongError",
    "device_kwargs",
    "engine_actor_options",
    "import_sglang_engine",
    "sglang_engine_kwargs",
    "sglang_sampling_params",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SGLANG_INSTALL_HINT = (
    "the 'sglang' engine needs SGLang (CUDA only), which pins its own torch / transformers "
    "and cannot share this workspace's environment: create a separate GPU environment with "
    "`pip install 'sglang>=0.5.20' genrm-serve` and point engine_config.python_executable at its "
    "python (see packages/genrm-serve/README.md, 'Engines'); or use engine 'hf'"
)

#: Memory regions released on sleep and restored on wake, in SGLang's tag names
#: (``utils/torch_memory_saver_adapter.py``). Resume must name exactly what was released: the
#: scheduler removes each tag from its offload set and fails on one it does not hold.
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")

#: Environment of an SGLang engine actor. NOSET: Ray leaves CUDA_VISIBLE_DEVICES alone, so the
#: actor (placed in its first bundle) can drive the engine's other GPUs by ``base_gpu_id``.
ENGINE_ENV = {
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "true",
}

#: Longest sleep() retries ``flush_cache`` while SGLang still has requests (slime: 60 x 1 s).
FLUSH_DEADLINE_S = 60.0
FLUSH_RETRY_S = 0.5
#: A health probe's deadline; below the worker's own probe deadline so this one reports.
HEALTH_PROBE_TIMEOUT_S = 5.0
#: How often the child-process watchdog looks.
CHILD_WATCH_S = 1.0
#: A run shared by prompts of one batch shorter than this is not computed ahead: a round trip
#: costs more than recomputing it (a GRPO group's question + reference runs hundreds of tokens).
PREFIX_WARM_MIN_TOKENS = 64
#: The shared runs of one wave of warm-ups, in tokens (``None`` or 0: every run in one wave).
#: In waves, the next one goes out when the previous one's warm-ups have finished, beside the
#: earlier groups' members. Off: on the H200 (Qwen3-4B shape, ``benchmarks/judge_engines.py``)
#: one wave of all made 245 / 376 judgments/s where waves of 2,048 tokens made 178 / 234; a
#: later wave waits for the earlier one's round trip, and SGLang prefills the first wave fast.
PREFIX_WARM_WAVE_TOKENS: int | None = None
#: Only a prefill-bound request is warmed up: one that generates at most this many tokens per
#: prompt token (a judge's verdict over a question and a reference). A rollout's samples share
#: their whole prompt too, but their decode dwarfs it, and a warm-up holds every member's first
#: token back by a round trip. ``None``: warm up whatever the request generates.
PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN: float | None = 1.0


#: The longest a request waits for the request of its group that is computing their shared run
#: (:meth:`SGLangEngine._submit_or_follow`). A judge's prompt of a few hundred tokens is
#: prefilled in tens of ms; a leader still running after this is decoding (a thinking judge),
#: and SGLang has its prompt in the radix cache by then (0.5.17 caches a request's prompt once
#: its prefill is done: ``batch_result_processor.py``, ``maybe_cache_unfinished_req``).
FOLLOW_WAIT_S = 0.5


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


class SGLangPromptTooLongError(PromptTooLongError):
    """A prompt over SGLang's own limits (read from the running engine): HTTP 413."""

    def __init__(self, prompt_tokens: int, limit: int, why: str) -> None:
        super().__init__(prompt_tokens, limit)
        self.why = why
        self.args = (f"prompt has {prompt_tokens} tokens, more than SGLang accepts ({why})",)

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.prompt_tokens, self.max_context_len, self.why))


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


def sglang_sampling_params(
    sampling: SamplingParams, max_new_tokens: int, *, deterministic: bool = False
) -> dict[str, Any]:
    """Our sampling parameters in SGLang's names (temperature 0 is greedy in both).

    ``top_k <= 0`` (off, as the hf engine reads it) is -1; ``seed`` is ``sampling_seed`` when
    the engine runs deterministic inference, else refused for a sampled request.
    """
    top_k = sampling.top_k if sampling.top_k is not None else -1
    temperature = sampling.temperature if sampling.temperature is not None else 1.0
    params: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "top_p": sampling.top_p if sampling.top_p is not None else 1.0,
        "top_k": top_k if top_k > 0 else -1,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        if deterministic:
            params["sampling_seed"] = sampling.seed
        elif temperature > 0:
            raise EngineError(
                f"seed={sampling.seed}: SGLang honours a seed only with deterministic inference; "
                "set engine_config.deterministic_inference=true for this instance, or send "
                "temperature 0 (greedy needs no seed)"
            )
    return params


@dataclass(frozen=True)
class _Prepared:
    """A request as SGLang gets it: prompt ids, sampling parameters, and the ids of "1" / "0"
    when it asks for a logprob verdict."""

    ids: list[int]
    params: dict[str, Any]
    verdict: tuple[int, int] | None


def shared_prefixes(prompts: list[list[int]], min_tokens: int) -> list[list[int]]:
    """The leading runs of at least ``min_tokens`` that two or more of ``prompts`` share (the
    roots of their radix tree), each once."""
    if len(prompts) < 2:
        return []
    return [
        node.tokens
        for node in build_forest(prompts, min_shared=min_tokens)
        if len(node.tokens) >= min_tokens and len(node.ending) + len(node.children) > 1
    ]


def run_of_each(prompts: list[list[int]], runs: list[list[int]]) -> list[int | None]:
    """For each prompt, the index in ``runs`` of the longest run that is its prefix (``None``:
    none is). The runs of :func:`shared_prefixes` are the roots of a radix tree, so a prompt
    starts with at most one of them; taking the longest keeps a prompt with its closest group
    should runs ever nest (its members wait for the run that gives them the most)."""
    owners: list[int | None] = []
    for prompt in prompts:
        best: int | None = None
        for r, run in enumerate(runs):
            longer = best is None or len(run) > len(runs[best])
            if longer and len(run) <= len(prompt) and prompt[: len(run)] == run:
                best = r
        owners.append(best)
    return owners


def prefill_bound(prep: _Prepared) -> bool:
    """Whether computing ``prep``'s prompt is most of its work
    (:data:`PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN`)."""
    ratio = PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN
    return ratio is None or prep.params["max_new_tokens"] <= ratio * len(prep.ids)


def warm_waves(runs: list[list[int]], wave_tokens: int | None) -> list[list[int]]:
    """``runs``' indices in waves of at most ``wave_tokens`` tokens of runs, in order (a run
    longer than that is a wave of its own); ``None`` or 0: one wave of all."""
    if not wave_tokens:
        return [list(range(len(runs)))] if runs else []
    waves: list[list[int]] = []
    size = 0
    for r, run in enumerate(runs):
        if not waves or size + len(run) > wave_tokens:
            waves.append([])
            size = 0
        waves[-1].append(r)
        size += len(run)
    return waves


def verdict_prob(meta: dict[str, Any], one: int, zero: int) -> float:
    """P("1") / (P("1") + P("0")) at the first reply token, from SGLang's
    ``output_token_ids_logprobs`` (per output position, ``(logprob, token_id, text)`` for each
    asked id: ``tokenizer_manager.py``)."""
    positions = meta.get("output_token_ids_logprobs") or []
    if not positions:
        raise EngineError("SGLang returned no output_token_ids_logprobs for a logprob verdict")
    lp = {int(e[1]): float(e[0]) for e in positions[0]}
    if one not in lp or zero not in lp:
        raise EngineError(f"SGLang's first-token log-probs lack token {one} or {zero}: {lp}")
    return 1.0 / (1.0 + math.exp(lp[zero] - lp[one]))


def _finish_reason(meta: dict[str, Any]) -> tuple[FinishReason, str | None]:
    raw = meta.get("finish_reason")
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind == "length":
        return "length", None
    if kind == "abort":
        message = raw.get("message") if isinstance(raw, dict) else None
        return "abort", str(message) if message else "aborted by SGLang"
    return "stop", None


def _flush_succeeded(result: Any) -> bool:
    """``FlushCacheReqOutput.success`` (older SGLang answered a bare bool, or None)."""
    if result is None:
        return True
    if isinstance(result, bool):
        return result
    return bool(getattr(result, "success", True))


def _ignore_sigquit_process_wide() -> None:
    """SIG_IGN for SIGQUIT through libc: ``signal.signal`` refuses off the main thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(int(signal.SIGQUIT), 1)  # SIG_IGN == 1 on Linux


def model_positions(model_dir: str) -> int | None:
    """``max_position_embeddings`` of a model folder's config.json (None if it has none)."""
    import json
    from pathlib import Path

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


class _EngineThread:
    """One thread that owns ``sgl.Engine`` and runs its event loop (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.engine: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self, build: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        self._thread = threading.Thread(target=self._main, args=(build,), name=self.name)
        self._thread.daemon = True
        self._thread.start()
        return self._ready

    def _main(self, build: Callable[[], Any]) -> None:
        try:
            engine = build()  # outside any running loop, as a script would build it
            loop = getattr(engine, "loop", None)
            if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed():
                loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.engine, self.loop = engine, loop
        except BaseException as err:
            self._ready.set_exception(err)
            return
        self._ready.set_result(engine)
        while not self._stopping:
            loop.run_forever()  # returns when a sync job (or stop) asks for the thread
            while True:
                try:
                    fn, fut = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as err:
                        fut.set_exception(err)

    def call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run a sync engine method on the thread while the loop is stopped."""
        assert self.loop is not None
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        self.loop.call_soon_threadsafe(self.loop.stop)
        return asyncio.wrap_future(fut)

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        """Schedule a coroutine of the engine on its loop."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self._stopping = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)


class SGLangEngine(Engine):
    """SGLang behind the :class:`Engine` interface; see the module docstring.

    ``engine_cls`` replaces ``sglang.Engine`` (tests inject ``genrm_serve.testing.
    FakeSGLangEngine``, which models the SGLang behaviours listed above). ``placement`` carries
    what only the caller knows (multi-node engines); pass it through ``create_engine_worker(...,
    worker_kwargs={"engine": SGLangEngine(spec, id, placement=...)})``.
    """

    continuous_batching = True

    def __init__(
        self,
        spec: InstanceSpec,
        engine_id: str,
        *,
        engine_cls: Callable[..., Any] | None = None,
        placement: SGLangPlacement | None = None,
    ) -> None:
        super().__init__(spec, engine_id)
        self._engine_cls = engine_cls
        self.placement = placement
        self._thread: _EngineThread | None = None
        self.sgl: Any = None
        self.prompts: PromptEncoder | None = None
        self.server_args: dict[str, Any] = {}
        self.counters = {
            "batches": 0,
            "requests": 0,
            "refused": 0,
            "flush_retries": 0,
            "prefix_warmups": 0,
            "prefix_warm_tokens": 0,
            "cached_prompt_tokens": 0,
            "followed": 0,  # requests that waited for their group's run (_submit_or_follow)
        }
        #: proves after each wake that the weights survived the sleep (``wake_check.py``)
        self.wake_check = WakeCheck(self, self.counters)
        #: SGLang's limits, read after start: prompts over ``prompt_limit`` are refused, and
        #: prompt + new tokens stay below ``context_len``.
        self.context_len = spec.engine_config.max_context_len
        self.prompt_limit = spec.engine_config.max_context_len
        self.limits_why = f"max_context_len={spec.engine_config.max_context_len}"
        self.failure: str | None = None
        self._children: list[Any] = []
        #: what SGLang's processes last wrote to stderr (for the errors of a failed child)
        self._stderr_tail: OutputTail | None = None
        self._pending: set[concurrent.futures.Future[Any]] = set()
        #: per ``prefix_key``, the prompt and future of the request computing the group's run now
        #: (:meth:`_submit_or_follow`)
        self._leaders: dict[str, tuple[list[int], asyncio.Future[Any]]] = {}
        self._last_output = 0.0
        self._control: asyncio.Lock | None = None
        #: the name of the weight-broadcast group SGLang's schedulers joined (init_weight_group)
        self._weight_group: str | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._prev_sigquit: Any = None

    @property
    def is_follower(self) -> bool:
        """A node_rank > 0 share of a multi-node engine: runs schedulers, serves nothing."""
        return self.placement is not None and self.placement.node_rank > 0

    # -- start -------------------------------------------------------------------------------
    async def start(self) -> None:
        from genrm_serve.models import resolve_adapter, resolve_model_path

        cfg = self.spec.engine_config
        if resolve_adapter(self.spec.model_path, cfg.adapter_path) is not None:
            # not silently the bare base: the embedded judge *is* base + adapter
            raise EngineError(
                f"engine {self.engine_id}: engine_config.adapter_path (or the embedded "
                "model's judge adapter) is applied by the hf engine only; use engine 'hf', "
                "or adapter_path 'none' for the bare base model"
            )
        engine_cls = self._engine_cls or import_sglang_engine()
        model_dir = resolve_model_path(self.spec.model_path)
        for key, value in ENGINE_ENV.items():
            if key.startswith("SGLANG_"):
                os.environ.setdefault(key, value)  # read by SGLang's children at spawn
        self.server_args = self._server_args(engine_cls, str(model_dir))
        self.prompts = await asyncio.to_thread(PromptEncoder.load, model_dir, cfg.max_context_len)
        if self.is_follower:
            # engine.py _launch_subprocesses: a node_rank >= 1 blocks until its schedulers exit
            # unless this is "0"; the Python API then returns without a tokenizer.
            os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"
        self._control = asyncio.Lock()
        before = set(multiprocessing.active_children())
        root = logging.getLogger()
        saved_handlers, saved_level = list(root.handlers), root.level
        # Before SGLang starts: a scheduler that dies while loading SIGQUITs this process, and
        # what it printed (its traceback) is what the error must carry.
        self._install_sigquit_guard()
        self._stderr_tail = OutputTail.install()
        self._thread = _EngineThread(f"sglang-{self.engine_id}")
        try:
            self.sgl = await asyncio.wrap_future(
                self._thread.start(lambda: engine_cls(**self.server_args))
            )
        except Exception as err:
            self.state = "failed"
            self._thread.stop()
            raise EngineError(
                f"engine {self.engine_id}: SGLang did not start: {type(err).__name__}: {err}"
                + self._stderr_tail.describe(settle_s=0.5)
            ) from err
        finally:
            self._stderr_tail.release_parent()
            # utils.configure_logger: logging.basicConfig(force=True) replaced our handlers.
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)
        self._children = [p for p in multiprocessing.active_children() if p not in before]
        _LIVE.add(self)
        if not self.is_follower:
            await self._read_limits()
        self._watch_task = asyncio.get_running_loop().create_task(self._watch_children())
        self.state = "awake"
        logger.info(
            "engine %s: SGLang up with %s; prompt limit %d (%s)",
            self.engine_id,
            self.server_args,
            self.prompt_limit,
            self.limits_why,
        )

    def _server_args(self, engine_cls: Any, model_path: str) -> dict[str, Any]:
        """Ours, then what our settings force on SGLang's defaults, then the user's
        ``engine_config.server_args`` (checked against the installed SGLang first)."""
        args = sglang_engine_kwargs(self.spec, model_path=model_path)
        gpus_on_node = self.spec.num_gpus_per_engine // (
            self.placement.nnodes if self.placement else 1
        )
        noset = os.environ.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES") == "1"
        args.update(
            device_kwargs(
                max(1, gpus_on_node),
                _assigned_gpus(),
                sees_all_gpus=noset,
                placement=self.placement,
            )
        )
        positions = model_positions(model_path)
        if positions is not None and args["context_length"] > positions:
            # SGLang refuses a context_length over the model's own (model_config.py
            # _derive_context_length, seen on 0.5.17): our default (8192) or a rollout's prompt
            # + response room must not stop a 4096-position model from starting.
            logger.info(
                "engine %s: context_length %d capped at the model's max_position_embeddings %d",
                self.engine_id,
                args["context_length"],
                positions,
            )
            args["context_length"] = positions
        user = dict(self.spec.engine_config.server_args)
        fields = server_arg_fields(engine_cls)
        graphs_saved = os.environ.get("SGLANG_MEMORY_SAVER_CUDA_GRAPH") == "true"
        where = f"engine {self.engine_id}"
        try:
            check_known_server_args(where, user, fields)
            forced = prefill_graph_args(user, fields, graphs_in_memory_saver=graphs_saved)
        except ValueError as err:
            raise EngineError(str(err)) from None
        return {**args, **forced, **user}

    async def _read_limits(self) -> None:
        assert self._thread is not None
        info: dict[str, Any] = await self._thread.call(self.sgl.get_server_info)
        context_len = int(info.get("context_length") or self.spec.engine_config.max_context_len)
        limit = context_len - 1  # tokenizer_manager: a prompt >= context_len is refused
        why = f"context_len={context_len}"
        max_input = info.get("max_req_input_len")
        # scheduler.py / managers/utils.py validate_input_length: a prompt >= max_req_input_len
        # is aborted (seen on 0.5.17: 250 tokens refused at max_req_input_len=250)
        if max_input is not None and int(max_input) - 1 < limit:
            limit = int(max_input) - 1
            why += f", max_req_input_len={int(max_input)}"
        self.context_len, self.prompt_limit, self.limits_why = context_len, limit, why

    def _install_sigquit_guard(self) -> None:
        if threading.current_thread() is threading.main_thread():

            def on_sigquit(signum: int, frame: Any) -> None:
                self._fail("an SGLang child process failed (it sent SIGQUIT to this process)")

            self._prev_sigquit = signal.signal(signal.SIGQUIT, on_sigquit)
        else:
            _ignore_sigquit_process_wide()  # the watchdog reports the dead child

    def mark_failed(self, why: str) -> None:
        self._fail(why)

    def _fail(self, why: str) -> None:
        if self.failure is None:
            if self._stderr_tail is not None:
                why += self._stderr_tail.describe()
            self.failure = why
            logger.error("engine %s failed: %s", self.engine_id, why)
        self.state = "failed"
        error = EngineError(f"engine {self.engine_id} failed: {why}")
        for fut in list(self._pending):
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                fut.set_exception(error)

    def _check_children(self) -> None:
        for proc in self._children:
            if not proc.is_alive():
                self._fail(f"SGLang child {proc.name} (pid {proc.pid}) exited {proc.exitcode}")
                return

    async def _watch_children(self) -> None:
        while self.state not in ("failed", "stopped"):
            self._check_children()
            await asyncio.sleep(CHILD_WATCH_S)

    # -- requests ----------------------------------------------------------------------------
    def _awake(self, action: str) -> Any:
        if self.sgl is None:
            raise EngineError(f"engine {self.engine_id} is not started")
        if self.state == "failed":
            raise EngineError(f"engine {self.engine_id} failed: {self.failure}")
        if self.state != "awake":
            raise EngineAsleepError(f"engine {self.engine_id} is {self.state}: cannot {action}")
        if self.placement is not None and self.placement.node_rank > 0:
            raise EngineError(
                f"engine {self.engine_id} is node_rank {self.placement.node_rank} of a "
                "multi-node SGLang engine: node_rank 0 serves its requests"
            )
        return self.sgl

    def _prepare(self, request: EngineRequest) -> _Prepared:
        assert self.prompts is not None
        verdict = self.prompts.verdict_tokens(request) if request.sampling.logprob_verdict else None
        ids = self.prompts.encode(request)
        if not ids:
            raise EngineError("empty prompt")
        if len(ids) > self.prompt_limit:
            raise SGLangPromptTooLongError(len(ids), self.prompt_limit, self.limits_why)
        default = self.spec.sampling_config.max_response_len or 1
        wanted = request.sampling.max_response_len or default
        max_new = max(0, min(wanted, self.context_len - 1 - len(ids)))
        deterministic = self.spec.engine_config.deterministic_inference
        params = sglang_sampling_params(request.sampling, max_new, deterministic=deterministic)
        return _Prepared(ids, params, verdict)

    def _submit(self, sgl: Any, prep: _Prepared, return_tokens: bool) -> asyncio.Future[Any]:
        assert self._thread is not None
        extra: dict[str, Any] = {}
        if prep.verdict is not None:  # both digits' log-probs at the first reply token
            extra["token_ids_logprob"] = list(prep.verdict)
        fut = self._thread.submit(
            sgl.async_generate(
                input_ids=prep.ids,
                sampling_params=prep.params,
                return_logprob=return_tokens or prep.verdict is not None,
                **extra,
            )
        )
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        return asyncio.wrap_future(fut)

    async def _warm_wave(self, warmups: list[asyncio.Future[Any]]) -> None:
        """Wait until every warm-up of one wave has finished, failed or not: an optimisation
        only, a failed warm-up leaves its members to compute the run themselves."""
        if warmups:
            await asyncio.wait(warmups)
        self.counters["prefix_warmups"] += sum(
            not w.cancelled() and w.exception() is None for w in warmups
        )

    async def _after_warm_up(
        self,
        sgl: Any,
        warmup: asyncio.Future[Any],
        prep: _Prepared,
        return_tokens: bool,
        wait_s: float | None = None,
    ) -> Any:
        """Submit a member of a group once its group's warm-up has finished (whatever its
        outcome), or after ``wait_s``; ``asyncio.wait`` so that cancelling one member leaves the
        warm-up to the others."""
        await asyncio.wait([warmup], timeout=wait_s)
        return await self._submit(sgl, prep, return_tokens)

    async def _submit_all(
        self,
        sgl: Any,
        prepared: dict[int, _Prepared],
        requests: list[EngineRequest],
        waits: dict[int, asyncio.Future[Any]],
        warmups: list[asyncio.Future[Any]],
    ) -> None:
        """Submit the batch into ``waits`` (one future a request), the runs its prompts share
        computed first, pipelined.

        Why warm up: SGLang prefills requests that arrive together side by side, none of them
        in its radix cache yet, so a GRPO group's judge prompts sent together would each
        recompute the group's question and reference; a run enters the radix cache when its
        request finishes. So each shared run (:func:`shared_prefixes`) is sent alone first, one
        new token, and its members (:func:`run_of_each`) go out as soon as *that* warm-up has
        finished (not after every group's); :data:`PREFIX_WARM_WAVE_TOKENS` can split the
        warm-ups into waves. A prompt that starts with no shared run, or that is not
        :func:`prefill_bound`, is submitted at once. ``warmups`` collects
        the warm-ups in flight, for the caller to cancel.

        Each request is its own ``async_generate`` call. Sending a wave's prompts as one call
        (one message to SGLang's scheduler) was measured on an H100 (2026-12-05): no faster on
        8 groups of 8, 14 % slower on 32 groups, where members no longer followed their own
        group's warm-up."""
        bound = [i for i, p in prepared.items() if prefill_bound(p)]
        prompts = [prepared[i].ids for i in bound]
        runs = shared_prefixes(prompts, PREFIX_WARM_MIN_TOKENS)
        owner = dict(zip(bound, run_of_each(prompts, runs), strict=True))
        members: dict[int, list[int]] = {}
        for i in prepared:  # in the batch's order
            r = owner.get(i)
            if r is not None:
                members.setdefault(r, []).append(i)
            else:
                waits[i] = self._submit_or_follow(sgl, prepared[i], requests[i])
        params = {"max_new_tokens": 1, "temperature": 0.0}
        for wave in warm_waves(runs, PREFIX_WARM_WAVE_TOKENS):
            sent = [self._submit(sgl, _Prepared(runs[r], params, None), False) for r in wave]
            warmups.extend(sent)
            self.counters["prefix_warm_tokens"] += sum(len(runs[r]) for r in wave)
            for r, warmup in zip(wave, sent, strict=True):
                # a later sample of this group, in another batch, follows the warm-up too
                for key in {requests[i].prefix_key for i in members.get(r, [])}:
                    self._lead(key, runs[r], warmup)
                for i in members.get(r, []):
                    chained = self._after_warm_up(
                        sgl, warmup, prepared[i], requests[i].return_tokens
                    )
                    waits[i] = asyncio.ensure_future(chained)
            await self._warm_wave(sent)

    def _submit_or_follow(
        self, sgl: Any, prep: _Prepared, request: EngineRequest
    ) -> asyncio.Future[Any]:
        """Submit a request that shares no run with its batch, unless a request of its group
        (the same ``prefix_key``) is computing their shared run right now: then it follows that
        one, as a batch's members follow their warm-up.

        Why: samples of a GRPO group reach a judge one by one as their rollouts finish (inline
        scoring), each a batch of one. A run enters SGLang's radix cache only once the request
        computing it is prefilled, so a sample arriving meanwhile would compute the whole
        question and reference again (on the H200, 256 samples arriving within a second took
        7,840 of 128,000 prompt tokens from the cache). Following costs it at most the rest of
        one prefill, and never more than :data:`FOLLOW_WAIT_S`."""
        key = request.prefix_key
        leader = self._leaders.get(key) if key is not None else None
        shared = common_prefix_len(leader[0], prep.ids) if leader is not None else 0
        if leader is not None and not leader[1].done() and shared >= PREFIX_WARM_MIN_TOKENS:
            self.counters["followed"] += 1
            return asyncio.ensure_future(
                self._after_warm_up(sgl, leader[1], prep, request.return_tokens, FOLLOW_WAIT_S)
            )
        fut = self._submit(sgl, prep, request.return_tokens)
        if len(prep.ids) >= PREFIX_WARM_MIN_TOKENS:
            self._lead(key, prep.ids, fut)
        return fut

    def _lead(self, key: str | None, ids: list[int], fut: asyncio.Future[Any]) -> None:
        """``fut`` computes ``ids``: later requests of group ``key`` follow it until it is done."""
        if key is None:
            return
        self._leaders[key] = (ids, fut)

        def forget(done: asyncio.Future[Any]) -> None:
            if self._leaders.get(key, (None, None))[1] is done:
                del self._leaders[key]

        fut.add_done_callback(forget)

    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        """Each request is its own ``async_generate``; errors stay with their request. Runs
        the batch's prompts share are computed first, group by group (:meth:`_submit_all`).
        Cancelled, it cancels every request and warm-up it has in flight."""
        sgl = self._awake("generate")
        results: list[EngineOutput | BaseException] = []
        prepared: dict[int, _Prepared] = {}
        for i, request in enumerate(requests):
            try:
                prepared[i] = self._prepare(request)
            except EngineError as err:
                results.append(err)
                continue
            results.append(EngineError("not run"))
        waits: dict[int, asyncio.Future[Any]] = {}
        warmups: list[asyncio.Future[Any]] = []
        try:
            await self._submit_all(sgl, prepared, requests, waits, warmups)
            done = await asyncio.gather(*waits.values(), return_exceptions=True)
        except BaseException:  # cancelled (or failing to submit): nothing of ours stays behind
            for w in [*waits.values(), *warmups]:
                w.cancel()
            raise
        for i, out in zip(waits, done, strict=True):
            request = requests[i]
            if isinstance(out, BaseException):
                results[i] = self._request_error(len(prepared[i].ids), out)
            else:
                results[i] = self._output(request, prepared[i], out)
                self._last_output = time.monotonic()
        self.counters["batches"] += 1
        self.counters["requests"] += len(requests)
        failed = [r for r in results if isinstance(r, BaseException)]
        self.counters["refused"] += len(failed)
        if failed:
            if len(requests) == 1:
                raise failed[0]
            raise EngineBatchError(results)
        return [r for r in results if isinstance(r, EngineOutput)]

    def _request_error(self, prompt_len: int, err: BaseException) -> BaseException:
        if isinstance(err, EngineError):
            return err
        text = str(getattr(err, "detail", None) or err)
        if "context length" in text:  # tokenizer_manager._validate_one_request
            return SGLangPromptTooLongError(prompt_len, self.prompt_limit, text)
        return EngineError(f"engine {self.engine_id}: SGLang refused the request: {text}")

    def _output(self, request: EngineRequest, prep: _Prepared, out: dict[str, Any]) -> EngineOutput:
        prompt = prep.ids
        meta = out.get("meta_info", {})
        self.counters["cached_prompt_tokens"] += int(meta.get("cached_tokens") or 0)
        finish, abort_message = _finish_reason(meta)
        lp_entries = meta.get("output_token_logprobs") or []
        token_ids = out.get("output_ids")
        if token_ids is None:
            token_ids = [int(e[1]) for e in lp_entries]
        result = EngineOutput(
            text=str(out.get("text", "")),
            finish_reason=finish,
            prompt_tokens=int(meta.get("prompt_tokens", len(prompt))),
            completion_tokens=int(meta.get("completion_tokens", len(token_ids))),
            weight_version=self.weight_version,
            extra={"route_key": self.spec.route_key, "engine_id": self.engine_id},
        )
        if abort_message:
            result.extra["abort"] = abort_message
        if prep.verdict is not None:
            result.extra["verdict_prob"] = verdict_prob(meta, *prep.verdict)
        if request.return_tokens:
            result.token_ids = [int(t) for t in token_ids]
            result.logprobs = [float(e[0]) for e in lp_entries]
        return result

    # -- health ------------------------------------------------------------------------------
    async def check_health(self) -> None:
        """Failed children or a generation that does not answer within the probe deadline."""
        self._check_children()
        if self.state == "failed":
            raise EngineError(f"engine {self.engine_id} failed: {self.failure}")
        if self.state != "awake" or self.is_follower or self._control is None:
            return
        if time.monotonic() - self._last_output < HEALTH_PROBE_TIMEOUT_S:
            return
        if self._control.locked():
            return  # a sleep / weight update is on its way: not the moment to add a request
        async with self._control:
            await self._probe()

    async def _probe(self) -> None:
        assert self._thread is not None and self.prompts is not None
        token = self.prompts.tokenizer.bos_token_id
        if token is None:
            token = self.prompts.tokenizer.eos_token_id or 0
        fut = self._thread.submit(
            self.sgl.async_generate(
                input_ids=[int(token)], sampling_params={"max_new_tokens": 1, "temperature": 0.0}
            )
        )
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), HEALTH_PROBE_TIMEOUT_S)
        except TimeoutError:
            raise EngineError(
                f"engine {self.engine_id}: health probe (one token) got no answer within "
                f"{HEALTH_PROBE_TIMEOUT_S} s; SGLang is hung or overloaded"
            ) from None
        self._last_output = time.monotonic()

    # -- memory ------------------------------------------------------------------------------
    async def _flush(self) -> None:
        assert self._thread is not None
        deadline = time.monotonic() + FLUSH_DEADLINE_S
        while True:
            result = await self._thread.call(self.sgl.flush_cache)
            if _flush_succeeded(result):
                return
            if time.monotonic() >= deadline:
                raise EngineError(
                    f"engine {self.engine_id}: SGLang flush_cache still failing after "
                    f"{FLUSH_DEADLINE_S} s (requests pending); not releasing memory"
                )
            self.counters["flush_retries"] += 1
            await asyncio.sleep(FLUSH_RETRY_S)

    async def sleep(self) -> None:
        if self.state != "awake":
            return
        if self.is_follower:  # rank 0's release reaches every rank's scheduler
            self.state = "asleep"
            return
        self._awake("sleep")
        assert self._thread is not None and self._control is not None and self.prompts is not None
        await self.wake_check.before_sleep(self.prompts.tokenizer.vocab_size)
        async with self._control:
            await self._flush()
            tags = self._sleep_tags()
            await self._thread.call(lambda: self.sgl.release_memory_occupation(tags=tags))
            self.state = "asleep"

    async def wake(self) -> None:
        if self.state != "asleep":
            return
        if not self.is_follower:
            assert self._thread is not None and self._control is not None
            async with self._control:
                tags = self._sleep_tags()
                await self._thread.call(lambda: self.sgl.resume_memory_occupation(tags=tags))
        self.state = "awake"
        if not self.is_follower:  # rank 0's probe runs on every rank's weights
            await self.wake_check.after_wake()

    def _sleep_tags(self) -> list[str]:
        """What a sleep releases: all of SGLang's memory, or all but the weights."""
        keep = {"weights"} if self.spec.engine_config.sleep_keeps_weights else set()
        return [t for t in MEMORY_TAGS if t not in keep]

    # -- weights -----------------------------------------------------------------------------
    def _check_version(self, version: int) -> None:
        if version <= self.weight_version:
            raise EngineError(
                f"engine {self.engine_id}: weight version {version} must be greater than "
                f"{self.weight_version}"
            )

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """``update_weights_from_tensor`` (then the KV cache is flushed); awake only."""
        sgl = self._awake("update weights")
        self._check_version(version)
        self.wake_check.invalidate()
        assert self._thread is not None and self._control is not None
        async with self._control:
            result = await self._thread.call(
                lambda: sgl.update_weights_from_tensor(
                    named_tensors=list(state_dict.items()), flush_cache=True
                )
            )
        _raise_unless_success(self.engine_id, "update_weights_from_tensor", result)
        self.weight_version = version

    async def update_weights_from_ipc(
        self, buckets: list[tuple[Any, Any]], version: int, done: bool = True
    ) -> None:
        """Flat bf16 buckets a trainer on this GPU shares through CUDA IPC, each mapped by
        SGLang's scheduler itself (``sglang_weights.py``); the KV cache is flushed with the
        sync's last bucket. As the hf engine's: a sync may come in several calls, and the weight
        version moves with the one marked ``done``."""
        from genrm_serve.engines.sglang_weights import flattened_bucket_payload

        sgl = self._awake("update weights")
        self._check_version(version)
        self.wake_check.invalidate()
        assert self._thread is not None and self._control is not None
        tp = int(self.server_args.get("tp_size", 1))
        payloads = [flattened_bucket_payload(meta, handle) for meta, handle in buckets]

        def load(payload: bytes, flush: bool) -> Callable[[], Any]:
            return lambda: sgl.update_weights_from_tensor(
                named_tensors=[payload] * tp, load_format="flattened_bucket", flush_cache=flush
            )

        async with self._control:
            for i, payload in enumerate(payloads):
                flush = done and i == len(payloads) - 1
                result = await self._thread.call(load(payload, flush))
                _raise_unless_success(self.engine_id, "update_weights_from_tensor", result)
        if done:
            self.weight_version = version

    @property
    def weight_group_ranks(self) -> int:
        """SGLang joins the weight group from each TP rank (``rank_offset + tp_rank``)."""
        planned = self.spec.num_gpus_per_engine // self.spec.engine_config.pp_size
        return int(self.server_args.get("tp_size", planned))

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str = "nccl"
    ) -> None:
        """Join the weight-broadcast group of trainer rank 0 (rank 0) and the engines, as ranks
        ``rank .. rank + weight_group_ranks - 1`` (SGLang's ``init_weights_update_group``: one
        member per TP rank). Blocks until every member has joined, as the hf engine's does."""
        from genrm_serve.engines.weights import WEIGHT_GROUP_NAME

        sgl = self._awake("join the weight group")
        if int(self.server_args.get("pp_size", 1)) != 1:
            # Pipeline stages repeat TP ranks: rank_offset + tp_rank would collide. (dp_size > 1
            # is DP attention here, sglang_engine_kwargs, which SGLang's group accepts.)
            raise EngineError(
                f"engine {self.engine_id}: the weight group needs pp_size=1 "
                f"(got {self.server_args['pp_size']}); use the object-store path"
            )
        if rank < 1 or rank + self.weight_group_ranks > world_size:
            raise EngineError(
                f"engine {self.engine_id}: ranks {rank}..{rank + self.weight_group_ranks - 1} "
                f"do not fit a weight group of {world_size} (rank 0 is the trainer)"
            )
        assert self._thread is not None and self._control is not None
        async with self._control:
            result = await self._thread.call(
                lambda: sgl.init_weights_update_group(
                    master_address=host,
                    master_port=port,
                    rank_offset=rank,
                    world_size=world_size,
                    group_name=WEIGHT_GROUP_NAME,
                    backend=backend,
                )
            )
        _raise_unless_success(self.engine_id, "init_weights_update_group", result)
        self._weight_group = WEIGHT_GROUP_NAME

    async def update_weights_from_broadcast(self, buckets: list[BucketMeta], version: int) -> None:
        """Receive every bucket of a sync from the weight group (one ``update_weights_from_
        distributed`` call per bucket, matching the trainer's one broadcast per bucket:
        ``sglang_weights.py``), then serve ``version``; the KV cache is flushed with the last."""
        from genrm_serve.engines.sglang_weights import distributed_bucket_request

        sgl = self._awake("update weights")
        self._check_version(version)
        group = self._weight_group
        if group is None:
            raise EngineError(f"engine {self.engine_id}: no weight group (init_weight_group)")
        self.wake_check.invalidate()
        assert self._thread is not None and self._control is not None

        def receive(request: dict[str, Any]) -> Callable[[], Any]:
            return lambda: sgl.update_weights_from_distributed(**request)

        async with self._control:
            for i, meta in enumerate(buckets):
                last = i == len(buckets) - 1
                request = distributed_bucket_request(meta, group, flush_cache=last)
                result = await self._thread.call(receive(request))
                _raise_unless_success(self.engine_id, "update_weights_from_distributed", result)
        self.weight_version = version

    async def update_weights_from_disk(self, model_path: str, version: int) -> None:
        """Load a checkpoint folder in place (elastic / disaggregated refit)."""
        sgl = self._awake("update weights")
        self._check_version(version)
        self.wake_check.invalidate()
        assert self._thread is not None and self._control is not None
        async with self._control:
            result = await self._thread.call(lambda: sgl.update_weights_from_disk(model_path))
        _raise_unless_success(self.engine_id, "update_weights_from_disk", result)
        self.weight_version = version

    async def shutdown(self) -> None:
        if self._watch_task is not None:
            self._watch_task.cancel()
            self._watch_task = None
        if self.sgl is not None and self._thread is not None:
            sgl, mine = self.sgl, list(self._children)
            _LIVE.discard(self)
            with contextlib.suppress(Exception):
                if any(e._children for e in _LIVE):  # another engine lives in this process
                    await self._thread.call(lambda: _shutdown_own_processes(sgl, mine))
                else:
                    await self._thread.call(sgl.shutdown)
            self.sgl = None
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        if self._prev_sigquit is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGQUIT, self._prev_sigquit)
            self._prev_sigquit = None
        self.state = "stopped"

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            **self.counters,
            "server_args": dict(self.server_args),
            "prompt_limit": self.prompt_limit,
            "context_len": self.context_len,
            "failure": self.failure,
        }


#: How long a shutdown waits for this engine's killed processes to be reaped (SGLang's own).
SHUTDOWN_REAP_S = 60.0
#: The started SGLang engines of this process, whose processes another's shutdown must spare.
_LIVE: weakref.WeakSet[SGLangEngine] = weakref.WeakSet()


def _shutdown_own_processes(sgl: Any, mine: list[Any]) -> None:
    """``sgl.Engine.shutdown`` for one engine of several in a process. SGLang's ends with
    ``kill_process_tree(os.getpid())`` (entrypoints/engine.py, seen on 0.5.17): every child of
    the process, another engine's scheduler and detokenizer included, which that engine then
    reports as crashed. This does its steps for this engine's own processes (and theirs)."""
    import psutil

    manager = getattr(sgl, "tokenizer_manager", None)
    watchdog = getattr(manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    rpc = getattr(sgl, "send_to_rpc", None)
    if rpc is not None:
        rpc.close(linger=0)
        sgl.send_to_rpc = None
    procs: list[Any] = []
    for child in mine:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(child.pid)
            procs += [*proc.children(recursive=True), proc]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=SHUTDOWN_REAP_S)


def _raise_unless_success(engine_id: str, what: str, result: Any) -> None:
    """SGLang's update calls answer ``(success, message)`` (or a dict with them)."""
    success, message = True, ""
    if isinstance(result, tuple) and result:
        success, message = bool(result[0]), str(result[1]) if len(result) > 1 else ""
    elif isinstance(result, dict):
        success, message = bool(result.get("success", True)), str(result.get("message", ""))
    if not success:
        raise EngineError(f"engine {engine_id}: SGLang {what} failed: {message}")
