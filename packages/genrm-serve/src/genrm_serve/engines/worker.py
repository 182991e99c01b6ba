"""The Ray actor that hosts one engine: its queue, lifecycle and weight updates.

Callers send single requests or lists (``generate_many``: the rewards send a GRPO group's
requests as one list); this actor queues each call as one unit and hands the engine batches of
whole units, as the :class:`~genrm_serve.engines.micro_batcher.MicroBatcher` forms them (the
batching policy lives there, not here), up to ``engine_config.max_batch_size`` requests — so the
samples of a group meet in one engine batch and share their prompt prefix there. An engine that
computes one batch at a time (hf) gets one batch at a time; an
engine that schedules requests itself (SGLang's continuous batching,
``Engine.continuous_batching``) gets each batch as it forms, so every request in flight reaches
it. The event loop stays free for health probes and stats (engines run their compute off the
loop); sleep and weight updates wait for the batches in flight. It is a plain Ray actor, not a
Serve replica, so rl-core can place it into a placement-group bundle of its plan
(:func:`create_engine_worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from genrm_serve import limits
from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineBatchError,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineTimeoutError,
    RequestRefusedError,
    engine_id_for,
)
from genrm_serve.engines.micro_batcher import MicroBatcher

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_START_TIMEOUT_S",
    "DEFAULT_WORKER_NUM_CPUS",
    "EngineWorker",
    "create_engine_worker",
    "engine_id_for",
]

logger = logging.getLogger(__name__)

#: Longest a request may wait in this actor, queue included, unless it carries less time left
#: (``EngineRequest.timeout_s``: the router's deadline, less what it waited there).
DEFAULT_REQUEST_TIMEOUT_S = limits.REQUEST_TIMEOUT_S
#: Longest loading a model may take: the supervisor's deadline too (one constant, limits.py).
DEFAULT_START_TIMEOUT_S = limits.ENGINE_START_TIMEOUT_S
#: Longest a sleep() waits for queued requests to finish before failing them.
DEFAULT_DRAIN_TIMEOUT_S = limits.DRAIN_TIMEOUT_S
#: Longest a health probe may take.
DEFAULT_HEALTH_TIMEOUT_S = limits.PROBE_TIMEOUT_S
#: Logical CPUs an engine actor asks Ray for (the 2-core CI machine hosts several).
DEFAULT_WORKER_NUM_CPUS = 0.1


@dataclass
class _Pending:
    request: EngineRequest
    future: asyncio.Future[EngineOutput]
    enqueued: float = field(default_factory=time.monotonic)


#: The requests of one call: they go into one engine batch together.
_Unit = list[_Pending]


class EngineWorker:
    """Hosts one :class:`Engine`; every public method is an (async) actor method.

    Usable in-process too (tests, benchmarks): ``w = EngineWorker(spec, 0); await w.start()``.
    """

    def __init__(
        self,
        spec: InstanceSpec,
        engine_index: int = 0,
        *,
        engine: Engine | None = None,
        batch_wait_s: float | None = None,
        batch_wait_max_s: float | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> None:
        self.spec = spec
        self.engine_index = engine_index
        self.engine_id = (
            engine.engine_id if engine is not None else engine_id_for(spec.route_key, engine_index)
        )
        self.engine = engine
        # The batcher's waits (seconds): the instance's engine_config unless given here; a wait
        # given without a cap is its own cap (engine_config refuses a cap below the wait).
        cfg = spec.engine_config
        wait_s = cfg.batch_wait_ms / 1e3 if batch_wait_s is None else batch_wait_s
        wait_max_s = max(
            wait_s, cfg.batch_wait_max_ms / 1e3 if batch_wait_max_s is None else batch_wait_max_s
        )
        self._batcher: MicroBatcher[_Pending] = MicroBatcher(cfg.max_batch_size, wait_s, wait_max_s)
        self.request_timeout_s = request_timeout_s
        self.start_timeout_s = start_timeout_s
        self._loop_task: asyncio.Task[None] | None = None
        #: a continuous engine's batches in flight (each a task)
        self._running: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self._accepting = False
        self._in_flight = 0
        self._counters: dict[str, float] = {
            "requests": 0,
            "succeeded": 0,
            "failed": 0,
            "batches": 0,
            "batched_requests": 0,
            "max_batch": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
        }
        self._start_error: str | None = None
        self._start_lock = asyncio.Lock()

    @property
    def batch_wait_s(self) -> float:
        return self._batcher.batch_wait_s

    @batch_wait_s.setter
    def batch_wait_s(self, value: float) -> None:
        self._batcher.batch_wait_s = value

    @property
    def batch_wait_max_s(self) -> float:
        return self._batcher.batch_wait_max_s

    @batch_wait_max_s.setter
    def batch_wait_max_s(self, value: float) -> None:
        self._batcher.batch_wait_max_s = value

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> dict[str, Any]:
        """Build and load the engine (idempotent, concurrent callers share one load)."""
        async with self._start_lock:
            return await self._start()

    async def _start(self) -> dict[str, Any]:
        if self._loop_task is not None:
            return self.info()
        if self.engine is None:
            from genrm_serve.engines import make_engine

            self.engine = make_engine(self.spec, self.engine_id)
        self.engine.state = "loading"
        try:
            await asyncio.wait_for(self.engine.start(), self.start_timeout_s)
        except BaseException as err:
            self.engine.state = "failed"
            self._start_error = f"{type(err).__name__}: {err}"
            logger.exception("engine %s failed to start", self.engine_id)
            raise
        self._lock = asyncio.Lock()
        self._accepting = True
        self._loop_task = asyncio.get_running_loop().create_task(self._batch_loop())
        logger.info("engine %s started (%s)", self.engine_id, type(self.engine).__name__)
        return self.info()

    def _engine(self) -> Engine:
        if self.engine is None or self._loop_task is None:
            raise EngineError(f"engine {self.engine_id} is not started (call start() first)")
        return self.engine

    async def sleep(self, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
        """Stop accepting, let queued requests finish (up to ``drain_timeout_s``), free memory.

        Requests arriving while asleep fail at once with :class:`EngineAsleepError`.
        """
        engine = self._engine()
        self._accepting = False
        assert self._lock is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._batcher.join(), drain_timeout_s)
        async with self._lock:
            self._fail_queued(EngineAsleepError(f"engine {self.engine_id} went to sleep"))
            await self._quiesce()
            await engine.sleep()

    async def wake(self) -> None:
        """Restore what :meth:`sleep` freed and accept requests again."""
        engine = self._engine()
        assert self._lock is not None
        async with self._lock:
            await engine.wake()
        self._accepting = True

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> int:
        """Load new weights between batches; returns the engine's new ``weight_version``."""
        engine = self._engine()
        assert self._lock is not None
        async with self._lock:
            await self._quiesce()
            await engine.update_weights(state_dict, version)
        return engine.weight_version

    async def update_weights_from_ipc(
        self, buckets: list[tuple[Any, Any]], version: int, done: bool = True
    ) -> int:
        """Flat weight buckets shared through CUDA IPC by a trainer on this GPU; see
        ``HFEngine.update_weights_from_ipc``. Returns the engine's ``weight_version``."""
        engine = self._engine()
        assert self._lock is not None
        async with self._lock:
            await self._quiesce()
            await engine.update_weights_from_ipc(buckets, version, done)
        return engine.weight_version

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str = "nccl"
    ) -> None:
        """Join the weight-broadcast group of trainer rank 0 and the engines (other GPUs)."""
        engine = self._engine()
        await engine.init_weight_group(host, port, rank, world_size, backend)

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> int:
        """Receive a sync's buckets from the weight group; returns the new ``weight_version``."""
        engine = self._engine()
        assert self._lock is not None
        async with self._lock:
            await self._quiesce()
            await engine.update_weights_from_broadcast(buckets, version)
        return engine.weight_version

    async def check_health(self) -> bool:
        """Raise if this engine cannot serve (asleep counts as healthy: it can be woken); else
        whether it is asleep (how ingress replicas that did not put it to sleep learn it)."""
        if self.engine is None or self._loop_task is None:
            raise EngineError(
                f"engine {self.engine_id} is not started"
                + (f": {self._start_error}" if self._start_error else "")
            )
        if self._loop_task.done():
            raise EngineError(f"engine {self.engine_id}: batch loop stopped")
        await asyncio.wait_for(self.engine.check_health(), DEFAULT_HEALTH_TIMEOUT_S)
        return self.engine.state == "asleep"

    async def stats(self) -> dict[str, Any]:
        """Queue depth, in-flight, counters, state and weight version (JSON-serialisable)."""
        base = self.engine.stats() if self.engine is not None else {}
        batches = self._counters["batches"]
        return {
            **base,
            "engine_id": self.engine_id,
            "route_key": self.spec.route_key,
            "state": self.engine.state if self.engine is not None else "created",
            "weight_version": self.engine.weight_version if self.engine is not None else 0,
            "accepting": self._accepting,
            "queue_depth": self._batcher.queued,
            "in_flight": self._in_flight,
            **{k: int(v) for k, v in self._counters.items()},
            "mean_batch": (self._counters["batched_requests"] / batches) if batches else 0.0,
        }

    def info(self) -> dict[str, Any]:
        """Who and where this engine is (placement checks, routing tests)."""
        gpu_ids: list[Any] = []
        node_ip = node_id = pg_id = None
        assigned: dict[str, float] = {}
        with contextlib.suppress(Exception):
            import ray

            if ray.is_initialized():
                ctx = ray.get_runtime_context()
                gpu_ids = list(ray.get_gpu_ids())
                node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
                node_id = ctx.get_node_id()
                pg_id = ctx.get_placement_group_id()
                assigned = dict(ctx.get_assigned_resources())  # type: ignore[no-untyped-call]
        return {
            "engine_id": self.engine_id,
            "engine_index": self.engine_index,
            "route_key": self.spec.route_key,
            "engine": type(self.engine).__name__ if self.engine is not None else None,
            "model_path": self.spec.model_path,
            "state": self.engine.state if self.engine is not None else "created",
            "pid": os.getpid(),
            "node_ip": node_ip,
            "node_id": node_id,
            "assigned_resources": assigned,
            "gpu_ids": gpu_ids,
            "placement_group_id": pg_id,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    async def control(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call one of the engine's ``CONTROL_METHODS`` (failure injection in test engines)."""
        engine = self._engine()
        allowed = getattr(engine, "CONTROL_METHODS", ())
        if method not in allowed:
            raise EngineError(
                f"engine {self.engine_id} ({type(engine).__name__}) has no control method "
                f"{method!r}; allowed: {list(allowed)}"
            )
        result = getattr(engine, method)(*args, **kwargs)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    async def shutdown(self) -> None:
        """Stop the batcher, fail what is queued, release the engine."""
        self._accepting = False
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        for task in list(self._running):
            task.cancel()
        await self._quiesce()
        self._fail_queued(EngineError(f"engine {self.engine_id} shut down"))
        if self.engine is not None:
            await self.engine.shutdown()
            self.engine.state = "stopped"

    # -- requests ----------------------------------------------------------------------------
    async def generate(self, request: EngineRequest) -> EngineOutput:
        """One request; concurrent calls are batched together."""
        (pending,) = self._submit([request])
        return await self._wait(pending)

    @overload
    async def generate_many(
        self, requests: list[EngineRequest], return_exceptions: Literal[False] = False
    ) -> list[EngineOutput]: ...
    @overload
    async def generate_many(
        self, requests: list[EngineRequest], return_exceptions: Literal[True]
    ) -> list[EngineOutput | BaseException]: ...
    async def generate_many(
        self, requests: list[EngineRequest], return_exceptions: bool = False
    ) -> list[EngineOutput] | list[EngineOutput | BaseException]:
        """Several requests in one engine batch (unless more than ``max_batch_size``), results
        in order; the first failure is raised, or with ``return_exceptions`` each failed
        request's error is its entry (the service's batches: one bad request fails alone)."""
        if not requests:
            return []
        pending = self._submit(requests)
        waits = (self._wait(p) for p in pending)
        return list(await asyncio.gather(*waits, return_exceptions=return_exceptions))

    def _submit(self, requests: list[EngineRequest]) -> _Unit:
        engine = self._engine()
        if not self._accepting or engine.state == "asleep":
            raise EngineAsleepError(f"engine {self.engine_id} is asleep (wake it first)")
        loop = asyncio.get_running_loop()
        unit: _Unit = []
        for request in requests:
            request.sampling = request.sampling.merged_over(self.spec.sampling_config)
            unit.append(_Pending(request, loop.create_future()))
        self._counters["requests"] += len(unit)
        self._batcher.put(unit)
        return unit

    async def _wait(self, pending: _Pending) -> EngineOutput:
        left = pending.request.timeout_s
        timeout_s = self.request_timeout_s if left is None else min(left, self.request_timeout_s)
        try:
            return await asyncio.wait_for(asyncio.shield(pending.future), timeout_s)
        except asyncio.CancelledError:
            pending.future.cancel()
            raise
        except TimeoutError:
            pending.future.cancel()
            raise EngineTimeoutError(
                f"engine {self.engine_id}: request timed out after {timeout_s:.3g} s"
            ) from None

    def _fail_queued(self, error: Exception) -> None:
        for unit in self._batcher.drain():
            for pending in unit:
                if not pending.future.done():
                    pending.future.set_exception(error)
                    self._counters["failed"] += 1
            self._batcher.task_done()

    async def _batch_loop(self) -> None:
        assert self._lock is not None
        continuous = self._engine().continuous_batching
        while True:
            units = await self._batcher.next_batch()
            # callers that gave up are skipped
            live = [p for unit in units for p in unit if not p.future.done()]
            if live and continuous:
                async with self._lock:  # not while a sleep or a weight update holds it
                    task = asyncio.get_running_loop().create_task(self._run_counted(units, live))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
                continue
            try:
                if live:
                    async with self._lock:
                        await self._run_counted([], live)
            finally:
                for _ in units:
                    self._batcher.task_done()

    async def _run_counted(self, units: list[_Unit], live: list[_Pending]) -> None:
        """One batch, counted in flight; ``units`` are marked done after it (a continuous
        engine's batches run as tasks: ``sleep`` joins the queue, so it waits for them)."""
        self._in_flight += len(live)
        try:
            await self._run(live)
        finally:
            self._in_flight -= len(live)
            for _ in units:
                self._batcher.task_done()

    async def _quiesce(self) -> None:
        """Wait for a continuous engine's batches in flight (the caller holds ``_lock``, so no
        new one starts): sleep and weight updates run on an idle engine."""
        if self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def _run(self, batch: list[_Pending]) -> None:
        engine = self._engine()
        try:
            outputs = await engine.generate([p.request for p in batch])
        except EngineBatchError as err:
            # Per-request failures (the engine ran the others): each request gets its own entry.
            self._count_batch(len(batch))
            for p, entry in zip(batch, err.results, strict=True):
                if isinstance(entry, BaseException):
                    self._settle(p, entry)
                else:
                    self._deliver(engine, p, entry, len(batch))
            return
        except RequestRefusedError as err:
            if len(batch) == 1:
                self._settle(batch[0], err)
                return
            # An engine that refuses the whole batch for one request (an over-long prompt): that
            # request must not fail its neighbours. The checks come before any compute, so
            # re-running one by one costs only tokenisation.
            for p in batch:
                await self._run([p])
            return
        except asyncio.CancelledError:
            for p in batch:
                self._settle(p, EngineError(f"engine {self.engine_id} shut down"))
            raise
        except Exception as err:
            logger.warning("engine %s: batch of %d failed: %s", self.engine_id, len(batch), err)
            for p in batch:
                self._settle(p, err)
            return
        if len(outputs) != len(batch):
            mismatch = EngineError(
                f"engine {self.engine_id} returned {len(outputs)} outputs for {len(batch)} requests"
            )
            for p in batch:
                self._settle(p, mismatch)
            return
        self._count_batch(len(batch))
        for p, out in zip(batch, outputs, strict=True):
            self._deliver(engine, p, out, len(batch))

    def _count_batch(self, size: int) -> None:
        self._counters["batches"] += 1
        self._counters["batched_requests"] += size
        self._counters["max_batch"] = max(self._counters["max_batch"], size)

    def _deliver(self, engine: Engine, pending: _Pending, out: EngineOutput, batch: int) -> None:
        out.latency_s = time.monotonic() - pending.enqueued
        out.weight_version = engine.weight_version
        out.extra.setdefault("engine_id", self.engine_id)
        out.extra.setdefault("route_key", self.spec.route_key)
        out.extra["batch_size"] = batch
        self._counters["prompt_tokens"] += out.prompt_tokens
        self._counters["completion_tokens"] += out.completion_tokens
        self._settle(pending, out)

    def _settle(self, pending: _Pending, result: EngineOutput | BaseException) -> None:
        if pending.future.done():
            return
        if isinstance(result, BaseException):
            self._counters["failed"] += 1
            pending.future.set_exception(result)
        else:
            self._counters["succeeded"] += 1
            pending.future.set_result(result)


@functools.cache
def _remote_worker_class() -> Any:
    """``ray.remote(EngineWorker)``, made on first use: importing this module loads no Ray."""
    import ray

    return ray.remote(EngineWorker)


def _placement_gpus(spec: InstanceSpec, placement_group: Any, bundle_index: int | None) -> float:
    if placement_group is not None:
        specs = placement_group.bundle_specs
        bundle = specs[bundle_index if bundle_index is not None and bundle_index >= 0 else 0]
        return float(bundle.get("GPU", 0.0))
    from genrm_serve.engine_refs import needs_gpus

    return float(spec.num_gpus_per_engine) if needs_gpus(spec, _cluster_has_gpus()) else 0.0


def _cluster_has_gpus() -> bool:
    import ray

    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return float(resources.get("GPU", 0.0)) > 0.0


def create_engine_worker(
    spec: InstanceSpec,
    engine_index: int,
    *,
    placement_group: Any = None,
    bundle_index: int | None = None,
    num_gpus: float | None = None,
    num_cpus: float | None = None,
    name: str | None = None,
    namespace: str | None = None,
    max_restarts: int = 0,
    worker_kwargs: dict[str, Any] | None = None,
    shared_gpu: bool = False,
) -> Any:
    """Create (not start) the Ray actor for engine ``engine_index`` of ``spec``.

    Call ``await handle.start.remote()`` next. GPUs: what the placement says — ``num_gpus`` when
    given (e.g. 0.2 to share a colocated bundle), else the GPUs of its bundle (``placement_group``
    / ``bundle_index``), else ``spec.num_gpus_per_engine`` if the engine computes on a GPU and the
    cluster has any (never a GPU for ``device: cpu`` or the scripted engine). With
    ``placement_group`` the actor goes into ``bundle_index`` of it.
    ``shared_gpu``: another inference engine's memory lives on the same GPUs (the shared
    layout); an SGLang engine then needs ``engine_config.mem_fraction_static``.
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if not ray.is_initialized():
        raise EngineError("create_engine_worker: Ray is not initialised (call ray.init first)")
    if num_gpus is None:
        num_gpus = _placement_gpus(spec, placement_group, bundle_index)
    options: dict[str, Any] = {
        "num_gpus": num_gpus,
        "num_cpus": DEFAULT_WORKER_NUM_CPUS if num_cpus is None else num_cpus,
        "max_restarts": max_restarts,
    }
    if name is not None:
        options["name"] = name
    if namespace is not None:
        options["namespace"] = namespace
    if placement_group is not None:
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group,
            placement_group_bundle_index=-1 if bundle_index is None else bundle_index,
            placement_group_capture_child_tasks=True,
        )
    elif bundle_index is not None:
        raise EngineError("create_engine_worker: bundle_index given without placement_group")
    from genrm_serve.engines.sglang import engine_actor_options

    # The SGLang engine's environment (its own interpreter, every GPU of the node visible).
    options.update(engine_actor_options(spec, shared_gpu=shared_gpu))
    cls = _remote_worker_class()
    return cls.options(**options).remote(spec, engine_index, **(worker_kwargs or {}))
