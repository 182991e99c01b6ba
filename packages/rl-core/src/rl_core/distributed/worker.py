"""One trainer rank: a Ray actor holding a training backend, in its bundle of the plan.

A worker is created per GPU of a role (``actor``, and in fully-async ``reference`` and
``actor_fwd``), joins the role's ``torch.distributed`` group (NCCL on CUDA, gloo on CPU), and
trains its share of each optimizer step. What a step does on a rank — old and reference log-probs
where nobody supplied them, then one ``train_step`` per global batch — is :func:`train_shards`,
shared with the in-process learner.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import torch

from rl_core.backends.base import BackendConfig, TrainingBackend, TrainItem
from rl_core.limits import PROCESS_GROUP_TIMEOUT_S

logger = logging.getLogger(__name__)

Logprobs = list[torch.Tensor]


def train_shards(
    backend: TrainingBackend,
    steps: list[list[TrainItem]],
    step_tokens: list[float],
    old: list[Logprobs] | None = None,
    ref: list[Logprobs] | None = None,
) -> dict[str, float]:
    """One rollout's training on this rank: ``steps[k]`` is its share of optimizer step ``k``.

    Old log-probs are needed only when a rollout takes several optimizer steps (the first step
    is on-policy and takes them from its own forward); the reference's only with a loaded
    reference model. Returns metric sums over the steps (the caller averages).
    """
    if old is None and len(steps) > 1:
        old = [backend.logprobs(s) for s in steps]
    if ref is None and getattr(backend, "ref_model", None) is not None:
        ref = [backend.logprobs(s, reference=True) for s in steps]
    sums: dict[str, float] = {}
    for k, items in enumerate(steps):
        m = backend.train_step(
            items,
            old_logprobs=old[k] if old is not None else None,
            ref_logprobs=ref[k] if ref is not None else None,
            total_tokens=step_tokens[k],
        )
        for key, value in m.items():
            sums[key] = sums.get(key, 0.0) + value
    return sums


def _ray_gpu_ids() -> list[Any]:
    try:
        import ray

        return list(ray.get_gpu_ids())
    except Exception:  # outside Ray (tests, benchmarks)
        return []


def _ray_node_id() -> str | None:
    try:
        import ray

        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # outside Ray
        return None


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class TrainWorker:
    """Rank ``rank`` of a role's group; every public method is an actor method."""

    def __init__(
        self,
        role: str,
        rank: int,
        world_size: int,
        model_path: str,
        cfg: BackendConfig,
        *,
        device: str = "auto",
        load_reference: bool | None = None,
        train_backend: str = "torch",
        megatron: Any = None,
    ) -> None:
        self.role, self.rank, self.world_size = role, rank, world_size
        self.model_path, self.cfg = model_path, cfg
        self.device = resolve_device(device)
        self.load_reference = load_reference
        self.train_backend, self.megatron = train_backend, megatron
        self.backend: Any = None
        self._buckets: list[Any] = []  # the plan of the weight sync in progress
        self._ipc_bucket: torch.Tensor | None = None  # alive until its engines have copied it
        self._sync_weights: dict[str, torch.Tensor] = {}  # what the sync in progress packs from
        self._weight_group: Any = None

    # --- set-up ----------------------------------------------------------------------------------

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group (this node's IP, a free port)."""
        import ray

        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        with socket.socket() as s:
            s.bind(("", 0))
            return ip, int(s.getsockname()[1])

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join the process group, then load the model (every rank the same weights)."""
        import datetime

        import torch.distributed as dist

        if self.world_size > 1 and not dist.is_initialized():
            if self.device == "cuda":
                torch.cuda.set_device(0)  # Ray shows each rank its own GPU as device 0
            dist.init_process_group(
                backend="nccl" if self.device == "cuda" else "gloo",
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S),
            )
        if self.train_backend == "megatron":  # builds Megatron's parallel state on the group
            from rl_core.backends.megatron.backend import MegatronBackend

            self.backend = MegatronBackend(
                self.model_path,
                self.cfg,
                self.megatron,
                device=self.device,
                load_reference=self.load_reference,
            )
        else:
            from rl_core.backends.torch_hf import TorchHFBackend

            self.backend = TorchHFBackend(
                self.model_path, self.cfg, device=self.device, load_reference=self.load_reference
            )
            if self.role != "actor":
                self.backend.model.requires_grad_(False)
        return self.where()

    def where(self) -> dict[str, Any]:
        """Where this rank runs, as Ray and CUDA see it (for the run's layout report)."""
        import ray

        ctx = ray.get_runtime_context()
        pg = ctx.get_placement_group_id()
        return {
            "role": self.role,
            "rank": self.rank,
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "placement_group_id": pg,
            "assigned_resources": dict(ctx.get_assigned_resources()),  # type: ignore[no-untyped-call]
            "device": self.device,
            "precision": getattr(self.backend, "precision", None),
        }

    # --- training --------------------------------------------------------------------------------

    def train(
        self,
        steps: list[list[TrainItem]],
        step_tokens: list[float],
        old: list[Logprobs] | None = None,
        ref: list[Logprobs] | None = None,
    ) -> dict[str, float]:
        return train_shards(self.backend, steps, step_tokens, old, ref)

    def logprobs(self, items: list[TrainItem], reference: bool = False) -> Logprobs:
        lps: Logprobs = self.backend.logprobs(items, reference=reference)
        return lps

    def export_weights(self) -> dict[str, torch.Tensor]:
        weights: dict[str, torch.Tensor] = self.backend.export_weights()
        return weights

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """A forward-only rank (``actor_fwd``) follows the policy after each weight sync."""
        if hasattr(self.backend, "load_weights"):  # Megatron: its names are not HF's
            self.backend.load_weights(state)
            return
        own = dict(self.backend.model.named_parameters())
        with torch.no_grad():
            for name, value in state.items():
                own[name].copy_(value.to(own[name].device, own[name].dtype))

    # --- weights on the device ------------------------------------------------------------------

    def weight_buckets(self, bucket_bytes: int, dtype: str = "bfloat16") -> list[Any]:
        """Plan the next weight sync: the policy in flat buckets of ``bucket_bytes``.

        The policy's engine-named weights are read once here and packed from for the rest of the
        sync (Megatron's are re-split from its fused layout on each read, and all-gathered under
        TP); nothing trains between the plan and the last bucket.
        """
        from genrm_serve import dtype_from_name, plan_buckets

        named = self.backend.named_weights()
        self._sync_weights = dict(named)
        self._buckets = plan_buckets(named, bucket_bytes, dtype_from_name(dtype))
        return list(self._buckets)

    def _pack(self, index: int) -> torch.Tensor:
        from genrm_serve import pack_bucket

        flat = pack_bucket(self._buckets[index], self._sync_weights, device=self.device)
        if flat.device.type == "cuda":
            torch.cuda.synchronize()
        return flat

    def export_bucket_ipc(self, index: int) -> tuple[Any, Any]:
        """Bucket ``index`` of the planned sync as a CUDA IPC handle for an engine on this GPU.

        The previous bucket is freed first (its engines returned, so they copied it): the sync
        holds one bucket of extra device memory at a time. Read from the host buffers when the
        trainer is offloaded.
        """
        from genrm_serve import ipc_handle

        self._ipc_bucket = None
        self._ipc_bucket = self._pack(index)
        return self._buckets[index], ipc_handle(self._ipc_bucket)

    def release_ipc(self) -> None:
        self._ipc_bucket = None
        self._sync_weights = {}
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()

    def init_weight_group(self, host: str, port: int, world_size: int, backend: str) -> None:
        """Rank 0 of the weight-broadcast group with the rollout engines (fully-async)."""
        from genrm_serve import WeightBroadcastGroup

        self._weight_group = WeightBroadcastGroup(host, port, 0, world_size, backend=backend)

    def broadcast_weights(self) -> float:
        """Every bucket of the planned sync to the weight group; returns seconds."""
        import time

        t0 = time.perf_counter()
        for i in range(len(self._buckets)):
            flat = self._pack(i)
            self._weight_group.broadcast(flat)
            del flat
        self._sync_weights = {}
        return time.perf_counter() - t0

    # --- memory ----------------------------------------------------------------------------------

    def offload(self) -> None:
        self.backend.offload()

    def onload(self) -> None:
        self.backend.onload()

    def memory(self) -> dict[str, Any]:
        """This rank's GPU as the driver sees it now (``mem_get_info``: every process on the
        GPU counts), plus the seconds of its last offload / onload."""
        out: dict[str, Any] = {"rank": self.rank, "role": self.role, "node_id": _ray_node_id()}
        if self.device == "cuda" and torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info()
            out |= {
                "gpu_used_bytes": total - free,
                "gpu_total_bytes": total,
                "gpu_allocated_bytes": torch.cuda.memory_allocated(),
                "gpu_ids": [str(g) for g in _ray_gpu_ids()],
            }
        if self.backend is not None and hasattr(self.backend, "last_move"):
            out |= self.backend.last_move()
        return out

    def step(self) -> int:
        return int(self.backend.step)

    def save(self, path: str, extra: dict[str, Any]) -> None:
        # torch: every rank holds the same weights and optimizer state, rank 0 writes; Megatron's
        # save is collective (weights gathered over TP, each rank writes its optimizer shard)
        if self.rank == 0 or self.train_backend == "megatron":
            self.backend.save(Path(path), extra)

    def save_hf(self, path: str, dtype: str) -> None:
        """The policy as an HF model folder (``rl_core.export``): rank 0 writes; Megatron's
        ranks all export (the TP gather is collective)."""
        if self.rank == 0 or self.train_backend == "megatron":
            from rl_core.export import save_backend_hf

            save_backend_hf(self.backend, Path(path), dtype, write=self.rank == 0)

    def load(self, path: str) -> dict[str, Any]:
        extra: dict[str, Any] = self.backend.load(Path(path))
        return extra

    def model_parallel_size(self) -> int:
        """Ranks that hold one copy of the model between them (Megatron's TP; 1 otherwise)."""
        return int(getattr(self.backend, "tp_size", 1))

    def shutdown(self) -> None:
        import torch.distributed as dist

        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
        if dist.is_initialized():
            dist.destroy_process_group()
