"""The driver's handles on trainer ranks: fan a call out, gather the answers.

``TrainGroup`` creates one :class:`~rl_core.distributed.worker.TrainWorker` actor per bundle of a
role in the realised plan (with the plan's GPU share), joins them into one ``torch.distributed``
group, and splits every optimizer step of a rollout across them by tokens. The GRPO driver talks
to a :class:`Learner` — this group, or :class:`LocalLearner` over a backend in this process — and
never knows how many ranks there are.

Every call to the ranks has a deadline (``rl_core.limits``): :data:`TRAINER_CALL_TIMEOUT_S`
for work, :data:`TRAINER_PROBE_TIMEOUT_S` for questions, :data:`TRAINER_START_TIMEOUT_S` for
the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from rl_core.backends.base import BackendConfig, TrainingBackend, TrainItem
from rl_core.distributed.sharding import split_by_tokens
from rl_core.distributed.worker import Logprobs, TrainWorker, train_shards
from rl_core.limits import (
    RANK_LOSS_SETTLE_S,
    TRAINER_CALL_TIMEOUT_S,
    TRAINER_PROBE_TIMEOUT_S,
    TRAINER_START_TIMEOUT_S,
)

#: Metrics every rank reports the same value of (the others are sums over ranks).
_SAME_ON_EVERY_RANK = frozenset({"grad_norm", "lr"})


def optimizer_steps(items: Sequence[TrainItem], size: int) -> list[list[TrainItem]]:
    """A rollout's samples cut into global batches of ``size`` (one optimizer step each)."""
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def in_loss_tokens(items: Sequence[TrainItem]) -> float:
    return float(sum(it.response_len for it in items if it.in_loss))


def average(per_rank: Sequence[dict[str, float]], steps: int) -> dict[str, float]:
    """Per-rank metric sums over ``steps`` optimizer steps → one mean per optimizer step."""
    out: dict[str, float] = {}
    for key in per_rank[0]:
        if key in _SAME_ON_EVERY_RANK:
            total = per_rank[0][key]
        else:
            total = sum(m.get(key, 0.0) for m in per_rank)
        out[key] = total / steps
    return out | {"optimizer_steps": float(steps)}


class Learner(Protocol):
    """What the GRPO driver needs of the policy being trained."""

    async def train(
        self,
        items: list[TrainItem],
        batch_size: int,
        *,
        old: list[torch.Tensor] | None = None,
        ref: list[torch.Tensor] | None = None,
    ) -> dict[str, float]: ...

    async def export_weights(self) -> Any: ...

    async def offload(self) -> None: ...

    async def onload(self) -> None: ...

    async def save(self, path: Path, extra: dict[str, Any]) -> None: ...

    async def save_hf(self, path: Path, dtype: str) -> None: ...

    async def load(self, path: Path) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RolloutSteps:
    """A rollout cut into optimizer steps: each step's samples (``items[k]``), its in-loss tokens
    (the loss's denominator) and, where the caller has them, its old and reference log-probs."""

    items: list[list[TrainItem]]
    tokens: list[float]
    old: list[Logprobs] | None
    ref: list[Logprobs] | None


class _StepwiseLearner(ABC):
    """:meth:`Learner.train`, written once: cut the rollout into optimizer steps, let the
    subclass train them (in this process or on the ranks), average the metrics per step."""

    async def train(
        self,
        items: list[TrainItem],
        batch_size: int,
        *,
        old: list[torch.Tensor] | None = None,
        ref: list[torch.Tensor] | None = None,
    ) -> dict[str, float]:
        steps = optimizer_steps(items, batch_size)
        cut = RolloutSteps(
            steps,
            [in_loss_tokens(s) for s in steps],
            _per_step(old, batch_size),
            _per_step(ref, batch_size),
        )
        return average(await self._train(cut), len(steps))

    @abstractmethod
    async def _train(self, steps: RolloutSteps) -> list[dict[str, float]]:
        """Train on ``steps``; the metric sums of each data-parallel rank (one per model copy)."""


class LocalLearner(_StepwiseLearner):
    """A :class:`Learner` over a backend in this process (its compute runs off the loop)."""

    def __init__(self, backend: TrainingBackend) -> None:
        self.backend = backend

    async def _train(self, steps: RolloutSteps) -> list[dict[str, float]]:
        sums = await asyncio.to_thread(
            train_shards, self.backend, steps.items, steps.tokens, steps.old, steps.ref
        )
        return [sums]

    async def export_weights(self) -> Any:
        return await asyncio.to_thread(self.backend.export_weights)

    async def offload(self) -> None:
        await asyncio.to_thread(self.backend.offload)

    async def onload(self) -> None:
        await asyncio.to_thread(self.backend.onload)

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        await asyncio.to_thread(self.backend.save, path, extra)

    async def save_hf(self, path: Path, dtype: str) -> None:
        from rl_core.export import save_backend_hf

        await asyncio.to_thread(save_backend_hf, self.backend, path, dtype)

    async def load(self, path: Path) -> dict[str, Any]:
        return await asyncio.to_thread(self.backend.load, path)


def _per_step(values: list[torch.Tensor] | None, size: int) -> list[Logprobs] | None:
    if values is None:
        return None
    return [values[i : i + size] for i in range(0, len(values), size)]


async def _dead_rank(calls: Sequence[asyncio.Future[Any]], settle_s: float) -> BaseException | None:
    """Ray's error for a rank that died, among ``calls`` (one per rank) after one failed: the
    others are given ``settle_s`` to answer; None when no rank died."""
    from ray.exceptions import RayActorError

    pending = [c for c in calls if not c.done()]
    if pending:
        await asyncio.wait(pending, timeout=settle_s)
    dead = None
    for call in calls:
        if not call.done():
            call.cancel()  # a survivor still in its collective: its process goes with the run
        elif not call.cancelled():
            err = call.exception()  # read, so none is left "never retrieved"
            if dead is None and isinstance(err, RayActorError):
                dead = err
    return dead


@functools.cache
def _remote_worker() -> Any:
    """``TrainWorker`` as a Ray actor class, made at the first use (Ray is imported only then)."""
    import ray

    return ray.remote(TrainWorker)


class _RayGroup:
    """Workers of one role of the realised plan, one per bundle, in one process group."""

    def __init__(
        self,
        realized: Any,
        role: str,
        model_path: str,
        cfg: BackendConfig,
        *,
        device: str,
        name_prefix: str,
        load_reference: bool | None = None,
        train_backend: str = "torch",
        megatron: Any = None,
    ) -> None:
        placement = realized.plan.roles[role]
        self.role = role
        self.world_size = len(placement.bundles)
        #: ranks that hold one model copy between them (Megatron's tensor parallelism)
        self.tp = 1
        self.precision: str | None = None
        cls = _remote_worker()
        self.workers = [
            cls.options(
                **realized.worker_options(role, rank), name=f"{name_prefix}{role}-{rank}"
            ).remote(
                role,
                rank,
                self.world_size,
                model_path,
                cfg,
                device=device,
                load_reference=load_reference,
                train_backend=train_backend,
                megatron=megatron,
            )
            for rank in range(self.world_size)
        ]

    async def _wait(self, what: str, refs: Sequence[Any], timeout_s: float) -> list[Any]:
        """The ranks' answers to ``refs`` (calls named ``what``), within ``timeout_s``.

        A call that fails because a rank died raises Ray's error for that rank, even where a
        surviving rank's own error (its collective lost a peer) came first: the dead rank is
        what the run must know of (``rl_core.restarts`` restarts it from its checkpoint).
        """
        calls = [asyncio.ensure_future(r) for r in refs]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*calls), timeout_s))
        except TimeoutError:
            raise TimeoutError(
                f"{self.role} ranks: {what} did not finish within {timeout_s:.0f} s"
            ) from None
        except Exception as err:
            dead = await _dead_rank(calls, RANK_LOSS_SETTLE_S)
            if dead is None or dead is err:
                raise
            raise dead from err

    async def _one(self, what: str, ref: Any, timeout_s: float = TRAINER_CALL_TIMEOUT_S) -> Any:
        return (await self._wait(what, [ref], timeout_s))[0]

    async def start(self) -> list[dict[str, Any]]:
        """Join the process group and load the model on every rank; where each rank runs."""
        addr, port = await self._one(
            "address", self.workers[0].address.remote(), TRAINER_PROBE_TIMEOUT_S
        )
        setups = [w.setup.remote(addr, port) for w in self.workers]
        where = await self._wait("setup", setups, TRAINER_START_TIMEOUT_S)
        mp = self.workers[0].model_parallel_size.remote()
        self.tp = int(await self._one("model_parallel_size", mp, TRAINER_PROBE_TIMEOUT_S))
        #: what the ranks compute in (e.g. "fp32: this CPU has no native bf16"), for the summary
        self.precision = where[0].get("precision")
        return where

    @property
    def data_parallel_size(self) -> int:
        return self.world_size // self.tp

    async def where(self) -> list[dict[str, Any]]:
        refs = [w.where.remote() for w in self.workers]
        return await self._wait("where", refs, TRAINER_PROBE_TIMEOUT_S)

    async def _all(
        self, method: str, *args: Any, timeout_s: float = TRAINER_CALL_TIMEOUT_S
    ) -> list[Any]:
        refs = [getattr(w, method).remote(*args) for w in self.workers]
        return await self._wait(method, refs, timeout_s)

    async def shutdown(self) -> None:
        await self._all("shutdown")
        await self.kill()

    async def kill(self) -> None:
        """End every rank at once, the living with the lost (their process group is broken):
        their bundles are free for the ranks that replace them."""
        import ray

        def kill_all() -> None:
            for w in self.workers:
                with contextlib.suppress(Exception):  # already gone
                    ray.kill(w, no_restart=True)

        await asyncio.to_thread(kill_all)  # GCS calls


class TrainGroup(_RayGroup, _StepwiseLearner):
    """The ``actor`` role: data-parallel training, the driver's :class:`Learner`."""

    async def _train(self, steps: RolloutSteps) -> list[dict[str, float]]:
        # data-parallel shards; the tensor-parallel peers of a shard (ranks r // tp) share it
        shards = [split_by_tokens(s, self.data_parallel_size) for s in steps.items]

        def pick(per_step: list[list[Any]] | None, rank: int) -> list[list[Any]] | None:
            if per_step is None:
                return None
            dp = rank // self.tp
            return [[per_step[k][i] for i in shards[k][dp]] for k in range(len(steps.items))]

        calls = [
            w.train.remote(
                pick(steps.items, r), steps.tokens, pick(steps.old, r), pick(steps.ref, r)
            )
            for r, w in enumerate(self.workers)
        ]
        per_rank = await self._wait("train", calls, TRAINER_CALL_TIMEOUT_S)
        return per_rank[:: self.tp]  # TP peers report the same numbers

    async def export_weights(self) -> Any:
        """Rank 0's weights as an object-store reference: one copy, shared by every engine.

        Under tensor parallelism the export gathers over the TP group: every rank takes part.
        """
        refs = [w.export_weights.remote() for w in self.workers[: self.tp]]
        if self.tp > 1:
            await self._wait("export_weights", refs[1:], TRAINER_CALL_TIMEOUT_S)
        return refs[0]

    async def offload(self) -> None:
        await self._all("offload")

    async def onload(self) -> None:
        await self._all("onload")

    async def memory(self) -> list[dict[str, Any]]:
        """Every rank's GPU memory now (and its last offload / onload seconds)."""
        return await self._all("memory", timeout_s=TRAINER_PROBE_TIMEOUT_S)

    # --- weights on the device (``rl_core.weight_sync``) ---------------------------------------

    async def weight_buckets(
        self, bucket_bytes: int, dtype: str, ranks: Sequence[int] = (0,)
    ) -> list[Any]:
        """Plan the next sync on ``ranks`` (every rank holds the same weights: the same plan)."""
        refs = [self.workers[r].weight_buckets.remote(bucket_bytes, dtype) for r in ranks]
        plans = await self._wait("weight_buckets", refs, TRAINER_CALL_TIMEOUT_S)
        return list(plans[0])

    async def export_bucket_ipc(self, rank: int, index: int) -> Any:
        return await self._one(
            "export_bucket_ipc", self.workers[rank].export_bucket_ipc.remote(index)
        )

    async def release_ipc(self, ranks: Sequence[int]) -> None:
        refs = [self.workers[r].release_ipc.remote() for r in ranks]
        await self._wait("release_ipc", refs, TRAINER_CALL_TIMEOUT_S)

    async def weight_group_address(self) -> tuple[str, int]:
        ref = self.workers[0].address.remote()
        addr, port = await self._one("address", ref, TRAINER_PROBE_TIMEOUT_S)
        return str(addr), int(port)

    async def init_weight_group(self, host: str, port: int, world_size: int, backend: str) -> None:
        ref = self.workers[0].init_weight_group.remote(host, port, world_size, backend)
        await self._one("init_weight_group", ref)

    async def broadcast_weights(self) -> float:
        return float(
            await self._one("broadcast_weights", self.workers[0].broadcast_weights.remote())
        )

    async def save(self, path: Path, extra: dict[str, Any]) -> None:
        await self._all("save", str(path), extra)

    async def save_hf(self, path: Path, dtype: str) -> None:
        """The policy as an HF model folder at ``path``, written by rank 0 (Megatron's ranks
        all take part: the weights are gathered over TP)."""
        await self._all("save_hf", str(path), dtype)

    async def load(self, path: Path) -> dict[str, Any]:
        extras = await self._all("load", str(path))
        return dict(extras[0])


class ForwardGroup(_RayGroup):
    """``reference`` or ``actor_fwd`` ranks of fully-async: log-probs only, split by tokens."""

    async def logprobs(self, items: list[TrainItem], *, reference: bool = False) -> list[Any]:
        shards = split_by_tokens(items, self.world_size)
        refs = [
            w.logprobs.remote([items[i] for i in shard], reference)
            for w, shard in zip(self.workers, shards, strict=True)
        ]
        parts = await self._wait("logprobs", refs, TRAINER_CALL_TIMEOUT_S)
        out: list[Any] = [None] * len(items)
        for shard, lps in zip(shards, parts, strict=True):
            for i, lp in zip(shard, lps, strict=True):
                out[i] = lp
        return out

    async def load_weights(self, weights: Any) -> None:
        await self._all("load_weights", weights)
