"""``SGLangEngine``: SGLang's in-process ``sgl.Engine`` behind the :class:`Engine` interface.

What it does with SGLang, and why, is the package's docstring (``engines/sglang/__init__.py``):
one behaviour of SGLang's source per item. Here: start-up, requests (mapped to SGLang's sampling
parameters, refused over SGLang's limits, their shared runs warmed up: ``prefix_warmup.py``),
health, sleep / wake, and weight updates. The launch arguments are ``launch.py``'s, the thread
and processes ``process.py``'s, the weight payloads ``weights.py``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import multiprocessing
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genrm_client.types import FinishReason, SamplingParams
from genrm_serve import limits
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
from genrm_serve.engines.prompts import PromptEncoder
from genrm_serve.engines.sglang.launch import (
    ENGINE_ENV,
    SGLangPlacement,
    import_sglang_engine,
    launch_server_args,
)
from genrm_serve.engines.sglang.prefix_warmup import WarmupPolicy, follow_or_lead, plan_warmups
from genrm_serve.engines.sglang.process import (
    EngineThread,
    OutputTail,
    dead_child,
    install_sigquit_guard,
    restore_sigquit,
    shutdown_own_processes,
)
from genrm_serve.engines.wake_check import WakeCheck

if TYPE_CHECKING:
    from genrm_serve.engines.weights import BucketMeta

__all__ = [
    "MEMORY_TAGS",
    "SGLangEngine",
    "SGLangPromptTooLongError",
    "sglang_sampling_params",
    "verdict_prob",
]

logger = logging.getLogger(__name__)

#: Memory regions released on sleep and restored on wake, in SGLang's tag names
#: (``utils/torch_memory_saver_adapter.py``). Resume must name exactly what was released: the
#: scheduler removes each tag from its offload set and fails on one it does not hold.
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


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


class SGLangEngine(Engine):
    """SGLang behind the :class:`Engine` interface; see the package docstring.

    ``engine_cls`` replaces ``sglang.Engine`` (tests inject ``genrm_serve.testing.
    FakeSGLangEngine``, which models the SGLang behaviours the package's docstring lists).
    ``placement`` carries what only the caller knows (multi-node engines); pass it through
    ``create_engine_worker(..., worker_kwargs={"engine": SGLangEngine(spec, id, placement=...)})``.
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
        self._thread: EngineThread | None = None
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
        #: which shared prompt runs are computed ahead (``prefix_warmup.py``)
        self.warmup_policy = WarmupPolicy()

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
        self.server_args = launch_server_args(
            self.spec, self.engine_id, engine_cls, str(model_dir), self.placement
        )
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
        self._prev_sigquit = install_sigquit_guard(self._fail)
        self._stderr_tail = OutputTail.install()
        self._thread = EngineThread(f"sglang-{self.engine_id}")
        try:
            self.sgl = await asyncio.wrap_future(
                self._thread.start(lambda: engine_cls(**self.server_args))
            )
        except Exception as err:
            self.state = "failed"
            self._thread.stop()
            raise EngineError(
                f"engine {self.engine_id}: SGLang did not start: {type(err).__name__}: {err}"
                + self._stderr_tail.describe(settle_s=limits.SGLANG_STDERR_SETTLE_S)
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
        why = dead_child(self._children)
        if why is not None:
            self._fail(why)

    async def _watch_children(self) -> None:
        while self.state not in ("failed", "stopped"):
            self._check_children()
            await asyncio.sleep(limits.SGLANG_CHILD_WATCH_S)

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
        computed first, pipelined, as ``prefix_warmup.plan_warmups`` decides (its module says
        why). ``warmups`` collects the warm-ups in flight, for the caller to cancel.

        Each request is its own ``async_generate`` call. Sending a wave's prompts as one call
        (one message to SGLang's scheduler) was measured on an H100 (2026-12-05): no faster on
        8 groups of 8, 14 % slower on 32 groups, where members no longer followed their own
        group's warm-up."""
        plan = plan_warmups(
            {i: p.ids for i, p in prepared.items()},
            {i: int(p.params["max_new_tokens"]) for i, p in prepared.items()},
            self.warmup_policy,
        )
        for i in plan.at_once:
            waits[i] = self._submit_or_follow(sgl, prepared[i], requests[i])
        params = {"max_new_tokens": 1, "temperature": 0.0}
        for wave in plan.waves:
            runs = [plan.runs[r] for r in wave]
            sent = [self._submit(sgl, _Prepared(run, params, None), False) for run in runs]
            warmups.extend(sent)
            self.counters["prefix_warm_tokens"] += sum(len(run) for run in runs)
            for r, warmup in zip(wave, sent, strict=True):
                members = plan.members[r]
                # a later sample of this group, in another batch, follows the warm-up too
                for key in {requests[i].prefix_key for i in members}:
                    self._lead(key, plan.runs[r], warmup)
                for i in members:
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
        one, as a batch's members follow their warm-up (``prefix_warmup.follow_or_lead``).
        Following costs it at most the rest of one prefill, and never more than
        ``limits.SGLANG_FOLLOW_WAIT_S``."""
        key = request.prefix_key
        leader = self._leaders.get(key) if key is not None else None
        running = leader[0] if leader is not None and not leader[1].done() else None
        action = follow_or_lead(prep.ids, running, self.warmup_policy)
        if action == "follow":
            assert leader is not None
            self.counters["followed"] += 1
            return asyncio.ensure_future(
                self._after_warm_up(
                    sgl, leader[1], prep, request.return_tokens, limits.SGLANG_FOLLOW_WAIT_S
                )
            )
        fut = self._submit(sgl, prep, request.return_tokens)
        if action == "lead":
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
        cached = int(meta.get("cached_tokens") or 0)  # the radix cache's hits
        self.counters["cached_prompt_tokens"] += cached
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
            extra={
                "route_key": self.spec.route_key,
                "engine_id": self.engine_id,
                "cached_prompt_tokens": cached,
            },
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
        if time.monotonic() - self._last_output < limits.SGLANG_PROBE_TIMEOUT_S:
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
            await asyncio.wait_for(asyncio.wrap_future(fut), limits.SGLANG_PROBE_TIMEOUT_S)
        except TimeoutError:
            raise EngineError(
                f"engine {self.engine_id}: health probe (one token) got no answer within "
                f"{limits.SGLANG_PROBE_TIMEOUT_S} s; SGLang is hung or overloaded"
            ) from None
        self._last_output = time.monotonic()

    # -- memory ------------------------------------------------------------------------------
    async def _flush(self) -> None:
        assert self._thread is not None
        deadline = time.monotonic() + limits.SGLANG_FLUSH_DEADLINE_S
        while True:
            result = await self._thread.call(self.sgl.flush_cache)
            if _flush_succeeded(result):
                return
            if time.monotonic() >= deadline:
                raise EngineError(
                    f"engine {self.engine_id}: SGLang flush_cache still failing after "
                    f"{limits.SGLANG_FLUSH_DEADLINE_S} s (requests pending); not releasing memory"
                )
            self.counters["flush_retries"] += 1
            await asyncio.sleep(limits.SGLANG_FLUSH_RETRY_S)

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
        SGLang's scheduler itself (``weights.py``); the KV cache is flushed with the
        sync's last bucket. As the hf engine's: a sync may come in several calls, and the weight
        version moves with the one marked ``done``."""
        from genrm_serve.engines.sglang.weights import flattened_bucket_payload

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
        ``weights.py``), then serve ``version``; the KV cache is flushed with the last."""
        from genrm_serve.engines.sglang.weights import distributed_bucket_request

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
                    await self._thread.call(lambda: shutdown_own_processes(sgl, mine))
                else:
                    await self._thread.call(sgl.shutdown)
            self.sgl = None
        if self._thread is not None:
            self._thread.stop()
            self._thread = None
        restore_sigquit(self._prev_sigquit)
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


#: The started SGLang engines of this process, whose processes another's shutdown must spare.
_LIVE: weakref.WeakSet[SGLangEngine] = weakref.WeakSet()


def _raise_unless_success(engine_id: str, what: str, result: Any) -> None:
    """SGLang's update calls answer ``(success, message)`` (or a dict with them)."""
    success, message = True, ""
    if isinstance(result, tuple) and result:
        success, message = bool(result[0]), str(result[1]) if len(result) > 1 else ""
    elif isinstance(result, dict):
        success, message = bool(result.get("success", True)), str(result.get("message", ""))
    if not success:
        raise EngineError(f"engine {engine_id}: SGLang {what} failed: {message}")
