"""The production GPU engine: SGLang's in-process ``sgl.Engine`` inside the engine's Ray actor.

SGLang pins its own torch (2.14.1) and transformers (5.19), which clash with this workspace's
lock, and needs CUDA; so it is imported lazily, only when an ``sglang`` engine starts, and lives
in a separate environment (see the package README). Everything here is written against SGLang's
documented *synchronous* Python API (0.5.x): ``sgl.Engine(**server_args)``, ``generate``,
``flush_cache``, ``release_memory_occupation`` / ``resume_memory_occupation``,
``update_weights_from_tensor`` / ``update_weights_from_disk``, ``shutdown``.

Why synchronous calls on one dedicated thread: ``sgl.Engine`` binds itself to the event loop of
the thread that builds it and drives its sync methods with ``loop.run_until_complete``, which
fails inside a running loop (the Ray actor's). So the engine is built, and every call made, on
one private thread; the actor awaits those calls without blocking its own loop. The worker in
front sends one batch at a time (SGLang batches it further inside), so calls never overlap.

Lifecycle: ``sleep`` = (no request in flight — the worker drains first, which is what SGLang's
``pause_generation`` would ensure) → ``flush_cache`` → ``release_memory_occupation`` (weights and
KV cache; needs ``enable_memory_saver``); ``wake`` = ``resume_memory_occupation``. The
:class:`SGLangEngine` state machine refuses generate and weight updates while asleep, because
SGLang itself would fail or hang on them.

Prompts are tokenised here (chat template with ``chat_template_kwargs``, context check before any
compute) and sent as ``input_ids``; log-probs are SGLang's ``output_token_logprobs`` — by SGLang's
convention those are of the distribution after temperature scaling unless the server is started
with ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (raw model); check this against the installed version.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from genrm_client.types import FinishReason, SamplingParams
from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineError,
    EngineOutput,
    EngineRequest,
)
from genrm_serve.engines.prompts import PromptEncoder

__all__ = [
    "SGLANG_INSTALL_HINT",
    "SGLangEngine",
    "import_sglang_engine",
    "sglang_engine_kwargs",
    "sglang_sampling_params",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

SGLANG_INSTALL_HINT = (
    "the 'sglang' engine needs SGLang (CUDA only), which pins torch 2.14.1 / transformers 5.19 "
    "and cannot share this workspace's environment: create a separate GPU environment with "
    "`pip install 'sglang>=0.5.20' genrm-serve` and run genrm-serve from it (see "
    "packages/genrm-serve/README.md, 'Engines'); or use engine 'hf'"
)

#: Memory regions SGLang can release (``release_memory_occupation(tags=...)``).
MEMORY_TAGS = ("weights", "kv_cache")


def import_sglang_engine() -> Callable[..., Any]:
    """``sglang.Engine``, or an ImportError that says how to install it."""
    try:
        import sglang
    except ImportError as err:
        raise ImportError(f"{SGLANG_INSTALL_HINT} ({err})") from err
    engine_cls: Callable[..., Any] = sglang.Engine
    return engine_cls


def sglang_engine_kwargs(
    spec: InstanceSpec, *, model_path: str, seed: int | None = None
) -> dict[str, Any]:
    """Map an instance's config to ``sgl.Engine`` server arguments (pure; raises on bad sizes).

    ``tp_size = num_gpus_per_engine / pp_size`` (an engine owns exactly its GPUs);
    ``dp_size > 1`` is data-parallel *attention* inside those GPUs (``enable_dp_attention``), so
    it must divide tp; ``ep_size`` (experts) must divide tp. ``context_length`` is
    ``max_context_len``; ``mem_fraction_static`` is passed only when set (SGLang's default
    otherwise). ``enable_memory_saver`` is on: sleep / wake need it.
    """
    cfg = spec.engine_config
    where = f"genrm instance {spec.route_key!r} (engine 'sglang')"
    gpus = spec.num_gpus_per_engine
    if gpus % cfg.pp_size:
        raise EngineError(
            f"{where}: num_gpus_per_engine={gpus} must be a multiple of pp_size={cfg.pp_size}"
        )
    tp = gpus // cfg.pp_size
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
        "log_level": "error",
    }
    if cfg.dp_size > 1:
        kwargs["enable_dp_attention"] = True
    if cfg.mem_fraction_static is not None:
        kwargs["mem_fraction_static"] = cfg.mem_fraction_static
    if cfg.dtype != "auto":
        kwargs["dtype"] = cfg.dtype
    if seed is not None:
        kwargs["random_seed"] = seed
    return kwargs


def sglang_sampling_params(sampling: SamplingParams, max_new_tokens: int) -> dict[str, Any]:
    """Our sampling parameters in SGLang's names (temperature 0 is greedy in both)."""
    params: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "temperature": sampling.temperature if sampling.temperature is not None else 1.0,
        "top_p": sampling.top_p if sampling.top_p is not None else 1.0,
        "top_k": sampling.top_k if sampling.top_k is not None else -1,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return params


def _finish_reason(meta: dict[str, Any]) -> tuple[FinishReason, str | None]:
    raw = meta.get("finish_reason")
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind == "length":
        return "length", None
    if kind == "abort":
        message = raw.get("message") if isinstance(raw, dict) else None
        return "abort", str(message) if message else "aborted by SGLang"
    return "stop", None


class SGLangEngine(Engine):
    """SGLang behind the :class:`Engine` interface; see the module docstring.

    ``engine_cls`` replaces ``sglang.Engine`` (tests inject ``genrm_serve.testing.
    FakeSGLangEngine``, a fake with the same methods, since SGLang cannot run without a GPU).
    """

    def __init__(
        self, spec: InstanceSpec, engine_id: str, *, engine_cls: Callable[..., Any] | None = None
    ) -> None:
        super().__init__(spec, engine_id)
        self._engine_cls = engine_cls
        self._executor: ThreadPoolExecutor | None = None
        self.sgl: Any = None
        self.prompts: PromptEncoder | None = None
        self.server_args: dict[str, Any] = {}
        self.counters = {"batches": 0, "requests": 0}

    async def _call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"sglang-{self.engine_id}")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def start(self) -> None:
        from genrm_serve.models import resolve_model_path

        engine_cls = self._engine_cls or import_sglang_engine()
        model_dir = resolve_model_path(self.spec.model_path)
        self.server_args = sglang_engine_kwargs(self.spec, model_path=str(model_dir))
        max_ctx = self.spec.engine_config.max_context_len
        self.prompts = await asyncio.to_thread(PromptEncoder.load, model_dir, max_ctx)
        self.sgl = await self._call(engine_cls, **self.server_args)
        self.state = "awake"
        logger.info("engine %s: SGLang up with %s", self.engine_id, self.server_args)

    def _awake(self, action: str) -> Any:
        if self.sgl is None:
            raise EngineError(f"engine {self.engine_id} is not started")
        if self.state != "awake":
            raise EngineAsleepError(f"engine {self.engine_id} is {self.state}: cannot {action}")
        return self.sgl

    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        sgl = self._awake("generate")
        assert self.prompts is not None
        ids = [self.prompts.checked(r) for r in requests]  # every check before any compute
        default = self.spec.sampling_config.max_response_len or 1
        params = [
            sglang_sampling_params(r.sampling, self.prompts.max_new_tokens(r, len(p), default))
            for r, p in zip(requests, ids, strict=True)
        ]
        want_logprobs = any(r.return_tokens for r in requests)
        raw = await self._call(
            sgl.generate, input_ids=ids, sampling_params=params, return_logprob=want_logprobs
        )
        results = raw if isinstance(raw, list) else [raw]
        if len(results) != len(requests):
            raise EngineError(
                f"engine {self.engine_id}: SGLang returned {len(results)} outputs for "
                f"{len(requests)} requests"
            )
        self.counters["batches"] += 1
        self.counters["requests"] += len(requests)
        return [self._output(r, p, out) for r, p, out in zip(requests, ids, results, strict=True)]

    def _output(
        self, request: EngineRequest, prompt: list[int], out: dict[str, Any]
    ) -> EngineOutput:
        meta = out.get("meta_info", {})
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
        if request.return_tokens:
            result.token_ids = [int(t) for t in token_ids]
            result.logprobs = [float(e[0]) for e in lp_entries]
        return result

    async def sleep(self) -> None:
        if self.state != "awake":
            return
        sgl = self._awake("sleep")
        await self._call(sgl.flush_cache)
        await self._call(sgl.release_memory_occupation, tags=list(MEMORY_TAGS))
        self.state = "asleep"

    async def wake(self) -> None:
        if self.state != "asleep":
            return
        await self._call(self.sgl.resume_memory_occupation, tags=list(MEMORY_TAGS))
        self.state = "awake"

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """``update_weights_from_tensor`` (then the KV cache is flushed); awake only."""
        sgl = self._awake("update weights")
        if version <= self.weight_version:
            raise EngineError(
                f"engine {self.engine_id}: weight version {version} must be greater than "
                f"{self.weight_version}"
            )
        result = await self._call(
            sgl.update_weights_from_tensor, named_tensors=list(state_dict.items()), flush_cache=True
        )
        _raise_unless_success(self.engine_id, "update_weights_from_tensor", result)
        self.weight_version = version

    async def update_weights_from_disk(self, model_path: str, version: int) -> None:
        """Load a checkpoint folder in place (elastic / disaggregated refit)."""
        sgl = self._awake("update weights")
        if version <= self.weight_version:
            raise EngineError(
                f"engine {self.engine_id}: weight version {version} must be greater than "
                f"{self.weight_version}"
            )
        result = await self._call(sgl.update_weights_from_disk, model_path)
        _raise_unless_success(self.engine_id, "update_weights_from_disk", result)
        self.weight_version = version

    async def shutdown(self) -> None:
        if self.sgl is not None:
            await self._call(self.sgl.shutdown)
            self.sgl = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self.state = "stopped"

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), **self.counters, "server_args": dict(self.server_args)}


def _raise_unless_success(engine_id: str, what: str, result: Any) -> None:
    """SGLang's update calls answer ``(success, message)`` (or a dict with them)."""
    success, message = True, ""
    if isinstance(result, tuple) and result:
        success, message = bool(result[0]), str(result[1]) if len(result) > 1 else ""
    elif isinstance(result, dict):
        success, message = bool(result.get("success", True)), str(result.get("message", ""))
    if not success:
        raise EngineError(f"engine {engine_id}: SGLang {what} failed: {message}")
