"""The trainer's weights into a rollout engine in another process, on CUDA: the CUDA-IPC path of
colocated runs (same GPU) and, with two GPUs, the NCCL broadcast path of fully-async runs.

The trainer rank is a :class:`TrainWorker` in this process (no Ray); the engine is genrm-serve's
hf engine in a spawned process (``gpu_engine_process``), so the IPC handles really cross a process
boundary. After each train step and sync, the engine holds the trainer's weights cast to bf16
bit for bit and reports the new weight version. Skipped without CUDA (the root conftest).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_engine_process import engine_process

from genrm_serve.testing import build_random_qwen3, free_port
from rl_core.backends.base import BackendConfig, TrainItem
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.distributed.worker import TrainWorker
from rl_core.engines import EngineHandle
from rl_core.weight_sync import BroadcastSync, IpcSync

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

#: small enough that the policy goes in several buckets (the embedding alone is ≈ 78 MB)
BUCKET_BYTES = 16 << 20
REPLY_TIMEOUT_S = 240.0


def _items() -> list[TrainItem]:
    g = torch.Generator().manual_seed(2)
    return [
        TrainItem(
            tokens=torch.randint(10, 500, (48,), generator=g).tolist(),
            response_start=16,
            advantage=1.0 if i % 2 else -1.0,
            in_loss=True,
        )
        for i in range(4)
    ]


def _worker(path: Path) -> TrainWorker:
    """Trainer rank 0 on this process's GPU, with its backend built directly (no Ray)."""
    cfg = BackendConfig(lr=1e-3, bf16=True)
    worker = TrainWorker("actor", 0, 1, str(path), cfg, device="cuda")
    worker.backend = TorchHFBackend(path, cfg, device="cuda")
    return worker


class ProcessEngine(EngineHandle):
    """The driver's handle on the engine process: each call is one message and its reply."""

    name = "rollout/0"

    def __init__(self, proc: Any, inbox: Any, outbox: Any) -> None:
        self.proc, self.inbox, self.outbox = proc, inbox, outbox

    def call(self, verb: str, payload: Any = None) -> Any:
        """The engine's reply; fails at once (not at a timeout) if the process died."""
        self.inbox.put((verb, payload))
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                status, reply = self.outbox.get(timeout=1.0)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"engine process exited ({self.proc.exitcode})") from None
                continue
            if status == "error":
                raise RuntimeError(f"engine process: {reply}")
            return reply
        raise TimeoutError(f"engine process did not answer {verb!r} in {REPLY_TIMEOUT_S} s")

    async def _call(self, verb: str, payload: Any = None) -> Any:
        return await asyncio.to_thread(self.call, verb, payload)

    async def update_weights_from_ipc(self, buckets: list[Any], version: int, done: bool) -> None:
        await self._call("ipc", (buckets, version, done))

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        await self._call("init_weight_group", (host, port, rank, world_size, backend))

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> None:
        await self._call("broadcast", (buckets, version))

    async def weight_version(self) -> int:
        return int(await self._call("version"))

    def served_weights(self, path: Path) -> dict[str, torch.Tensor]:
        assert self.call("save_weights", str(path)) == "torch.bfloat16"
        weights: dict[str, torch.Tensor] = torch.load(path)
        return weights

    # not used by the weight syncs
    async def generate(self, requests: Any) -> Any:
        raise NotImplementedError

    async def sleep(self) -> None:
        raise NotImplementedError

    async def wake(self) -> None:
        raise NotImplementedError

    async def update_weights(self, state_dict: Any, version: int) -> None:
        raise NotImplementedError

    async def state(self) -> str:
        raise NotImplementedError

    async def stats(self) -> dict[str, Any]:
        raise NotImplementedError


@contextmanager
def _engine_process(path: Path, device_index: int) -> Iterator[ProcessEngine]:
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=engine_process, args=(str(path), device_index, inbox, outbox))
    proc.start()
    engine = ProcessEngine(proc, inbox, outbox)
    try:
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            try:
                status, version = outbox.get(timeout=1.0)
                break
            except queue.Empty:
                assert proc.is_alive(), f"engine process exited ({proc.exitcode})"
                assert time.monotonic() < deadline, "engine process did not start"
        assert (status, version) == ("ready", 0)
        yield engine
        engine.call("stop")
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)


class WorkerLearner:
    """The trainer group's weight calls over the in-process TrainWorker (rank 0 only)."""

    def __init__(self, worker: TrainWorker) -> None:
        self.worker = worker

    async def weight_buckets(self, bucket_bytes: int, dtype: str, ranks: Any) -> list[Any]:
        return self.worker.weight_buckets(bucket_bytes, dtype)

    async def export_bucket_ipc(self, rank: int, index: int) -> Any:
        assert rank == 0
        return self.worker.export_bucket_ipc(index)

    async def release_ipc(self, ranks: Any) -> None:
        self.worker.release_ipc()

    async def weight_group_address(self) -> tuple[str, int]:
        return "127.0.0.1", free_port()

    async def init_weight_group(self, host: str, port: int, world: int, backend: str) -> None:
        await asyncio.to_thread(self.worker.init_weight_group, host, port, world, backend)

    async def broadcast_weights(self) -> float:
        return await asyncio.to_thread(self.worker.broadcast_weights)


def _assert_serves_the_trainers_bf16_weights(
    engine: ProcessEngine, worker: TrainWorker, path: Path, before: dict[str, torch.Tensor]
) -> None:
    served = engine.served_weights(path)
    trainer = dict(worker.backend.named_weights())
    assert set(served) == set(trainer)
    for name, p in trainer.items():
        assert torch.equal(served[name], p.to(torch.bfloat16).cpu()), name
    assert any(not torch.equal(served[n], before[n]) for n in served)  # the sync changed them


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 2 layers × 256 with Qwen3's vocabulary: several buckets, seconds to build
    return build_random_qwen3(
        tmp_path_factory.mktemp("policy-gpu"),
        layers=2,
        hidden=256,
        mlp=768,
        heads=4,
        kv_heads=2,
        head_dim=64,
        max_positions=1024,
    )


@pytest.fixture(autouse=True)
def _eager_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    # the engine process inherits it: compiled layers would cost ~15 s on the first batch
    monkeypatch.setenv("GENRM_HF_COMPILE", "0")


async def test_ipc_sync_gives_an_engine_process_the_trainers_weights_bit_for_bit(
    policy_path: Path, tmp_path: Path
) -> None:
    worker = _worker(policy_path)
    with _engine_process(policy_path, 0) as engine:
        before = engine.served_weights(tmp_path / "v0.pt")
        sync = IpcSync(WorkerLearner(worker), [engine], ranks=[0], bucket_bytes=BUCKET_BYTES)
        for version in (1, 2):
            worker.backend.train_step(_items(), old_logprobs=None)
            await sync.sync(version)  # ends with the engine's version checked
            assert len(worker._buckets) > 1  # it really went bucket by bucket
            assert worker._ipc_bucket is None  # the last bucket is released
            assert await engine.weight_version() == version
            assert engine.call("generate", [5, 6, 7, 8]) == version  # what a rollout reports
            _assert_serves_the_trainers_bf16_weights(
                engine, worker, tmp_path / f"v{version}.pt", before
            )
            before = engine.served_weights(tmp_path / f"v{version}.pt")


async def test_nccl_broadcast_sync_into_an_engine_on_another_gpu(
    policy_path: Path, tmp_path: Path
) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("the NCCL broadcast path needs 2 GPUs (NCCL cannot pair two ranks on one GPU)")
    worker = _worker(policy_path)  # cuda:0
    with _engine_process(policy_path, 1) as engine:
        before = engine.served_weights(tmp_path / "v0.pt")
        sync = BroadcastSync(
            WorkerLearner(worker),
            [engine],
            bucket_bytes=BUCKET_BYTES,
            dtype="bfloat16",
            backend="nccl",
        )
        await sync.setup()
        for version in (1, 2):
            worker.backend.train_step(_items(), old_logprobs=None)
            await sync.sync(version)
            assert len(worker._buckets) > 1
            assert engine.call("generate", [5, 6, 7, 8]) == version
            _assert_serves_the_trainers_bf16_weights(
                engine, worker, tmp_path / f"v{version}.pt", before
            )
            before = engine.served_weights(tmp_path / f"v{version}.pt")
