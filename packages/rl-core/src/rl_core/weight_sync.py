"""How the policy's weights reach the rollout engines after a step, chosen from the plan.

- ``ipc`` — colocate on GPUs, hf or SGLang rollout engines, each engine on a bundle of an actor
  rank (SGLang's scheduler maps the buckets itself, ``genrm_serve/engines/sglang/weights.py``): flat
  bf16 buckets on the GPU, shared through CUDA IPC by the actor rank on the engine's GPU, one
  bucket at a time (extra device memory: one bucket).
- ``broadcast`` — fully-async on GPUs, hf or SGLang rollout engines: flat bf16 buckets broadcast
  from actor rank 0 over a NCCL group of its own with the engines, one broadcast per bucket (its
  bytes: ``genrm_serve.WeightBroadcastGroup``). An hf engine takes one rank of the group, an
  SGLang engine one per TP rank (its schedulers join through SGLang's
  ``init_weights_update_group``); each engine reports how many (``weight_group_ranks`` in its
  stats) and gets the next ones after the trainer's rank 0.
- ``object_store`` — everything else (CPU, ``--device cpu``, engines without a device path):
  rank 0's state dict, one object-store put shared by every engine.

Every path ends with each engine's weight version checked
(:class:`~rl_core.engines.StaleWeightsError` otherwise). The bucket layout is genrm-serve's
(``genrm_serve.plan_buckets``): both sides agree on it because one module owns it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from genrm_serve import DEFAULT_BUCKET_BYTES
from rl_core.engines import EngineHandle, check_version, sync_weights

SyncPath = Literal["ipc", "broadcast", "object_store"]


class WeightSync(Protocol):
    path: SyncPath

    async def setup(self) -> None: ...

    async def sync(self, version: int) -> None: ...


def colocated_ranks(plan: Any) -> list[int] | None:
    """Per rollout engine, the actor rank on its first bundle; None if one has no such rank."""
    actor = plan.roles.get("actor")
    if actor is None:
        return None
    rank_of = {b: r for r, b in enumerate(actor.bundles)}
    ranks: list[int] = []
    for engine in plan.engines_of("rollout"):
        if engine.group != actor.group or engine.bundles[0] not in rank_of:
            return None
        ranks.append(rank_of[engine.bundles[0]])
    return ranks


def choose_weight_sync(plan: Any, *, use_gpus: bool, device: str, engine: str) -> SyncPath:
    """The path of :func:`make_weight_sync` for this plan (the list in the module docstring)."""
    if not use_gpus or device == "cpu" or engine not in ("hf", "sglang"):
        return "object_store"
    if plan.phases_overlap:
        return "broadcast"
    if colocated_ranks(plan) is not None:
        return "ipc"
    return "object_store"


class ObjectStoreSync:
    """Rank 0's state dict as one object-store reference, shared by every engine."""

    path: SyncPath = "object_store"

    def __init__(self, learner: Any, engines: Sequence[EngineHandle]) -> None:
        self.learner, self.engines = learner, list(engines)

    async def setup(self) -> None:
        return None

    async def sync(self, version: int) -> None:
        weights = await self.learner.export_weights()
        await asyncio.gather(*(sync_weights(e, weights, version) for e in self.engines))


class IpcSync:
    """Bucket by bucket: each engine's colocated actor rank packs it, the engine copies it."""

    path: SyncPath = "ipc"

    def __init__(
        self,
        learner: Any,
        engines: Sequence[EngineHandle],
        ranks: Sequence[int],
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        dtype: str = "bfloat16",
    ) -> None:
        if len(ranks) != len(engines):
            raise ValueError(f"{len(engines)} engines but {len(ranks)} colocated ranks")
        self.learner, self.engines, self.ranks = learner, list(engines), list(ranks)
        self.bucket_bytes, self.dtype = bucket_bytes, dtype
        #: seconds of the last sync, per part
        self.last: dict[str, float] = {}

    async def setup(self) -> None:
        return None

    async def sync(self, version: int) -> None:
        t0 = time.perf_counter()
        serving = sorted(set(self.ranks))
        buckets = await self.learner.weight_buckets(self.bucket_bytes, self.dtype, serving)
        try:
            for i in range(len(buckets)):
                handles = dict(
                    zip(
                        serving,
                        await asyncio.gather(
                            *(self.learner.export_bucket_ipc(r, i) for r in serving)
                        ),
                        strict=True,
                    )
                )
                done = i == len(buckets) - 1
                await asyncio.gather(
                    *(
                        e.update_weights_from_ipc([handles[r]], version, done)
                        for e, r in zip(self.engines, self.ranks, strict=True)
                    )
                )
        finally:
            await self.learner.release_ipc(serving)
        await asyncio.gather(*(check_version(e, version) for e in self.engines))
        self.last = {"buckets": float(len(buckets)), "seconds": time.perf_counter() - t0}


def group_ranks(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Each engine's first rank in the weight group, and the group's size, for engines taking
    ``sizes`` ranks each (an SGLang engine of TP size ``t`` joins as ``first .. first + t - 1``:
    ``rank_offset + tp_rank``). Rank 0 is the trainer's."""
    if any(n < 1 for n in sizes):
        raise ValueError(f"every engine takes at least one rank of the weight group: {sizes}")
    first, nxt = [], 1
    for n in sizes:
        first.append(nxt)
        nxt += n
    return first, nxt


class BroadcastSync:
    """Actor rank 0 broadcasts every bucket over a process group with the engines."""

    path: SyncPath = "broadcast"

    def __init__(
        self,
        learner: Any,
        engines: Sequence[EngineHandle],
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        dtype: str = "bfloat16",
        backend: str = "nccl",
    ) -> None:
        self.learner, self.engines = learner, list(engines)
        self.bucket_bytes, self.dtype, self.backend = bucket_bytes, dtype, backend
        self._ready = False

    async def setup(self) -> None:
        """Form the group once: trainer rank 0 is rank 0, then each engine's ranks in turn
        (:func:`group_ranks`)."""
        if self._ready:
            return
        stats = await asyncio.gather(*(e.stats() for e in self.engines))
        missing = [i for i, st in enumerate(stats) if "weight_group_ranks" not in st]
        if missing:  # a guessed size would leave the group waiting for ranks that never join
            raise RuntimeError(
                f"rollout engines {missing} report no weight_group_ranks in stats(); "
                "the weight group cannot be sized (genrm-serve older than rl-core?)"
            )
        first, world = group_ranks([int(st["weight_group_ranks"]) for st in stats])
        host, port = await self.learner.weight_group_address()
        await asyncio.gather(
            self.learner.init_weight_group(host, port, world, self.backend),
            *(
                e.init_weight_group(host, port, r, world, self.backend)
                for r, e in zip(first, self.engines, strict=True)
            ),
        )
        self._ready = True

    async def sync(self, version: int) -> None:
        await self.setup()
        buckets = await self.learner.weight_buckets(self.bucket_bytes, self.dtype, (0,))
        await asyncio.gather(
            self.learner.broadcast_weights(),
            *(e.update_weights_from_broadcast(buckets, version) for e in self.engines),
        )
        await asyncio.gather(*(check_version(e, version) for e in self.engines))


def make_weight_sync(
    path: SyncPath,
    learner: Any,
    engines: Sequence[EngineHandle],
    *,
    plan: Any = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> WeightSync:
    if path == "ipc":
        ranks = colocated_ranks(plan)
        if ranks is None:
            raise ValueError("the ipc weight path needs every rollout engine on an actor bundle")
        return IpcSync(learner, engines, ranks, bucket_bytes=bucket_bytes)
    if path == "broadcast":
        return BroadcastSync(learner, engines, bucket_bytes=bucket_bytes)
    return ObjectStoreSync(learner, engines)
