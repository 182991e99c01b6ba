"""The memory handoff with fakes: no generate while asleep, no training while engines are awake on
a shared bundle, offload buffers reused across steps, weight versions monotone; and which weight
path each plan takes, with the ipc and broadcast syncs driven end to end where the CPU allows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from genrm_serve.config import EngineConfig, InstanceSpec
from genrm_serve.engines.hf import HFEngine
from genrm_serve.engines.weights import HostOffloader
from genrm_serve.testing import build_tiny_model, free_port
from rl_core.backends.base import BackendConfig, TrainItem
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.distributed.worker import TrainWorker
from rl_core.engines import LocalEngineHandle, StaleWeightsError
from rl_core.phases import GroupSleeper, PhaseMachine, phases_from_plan
from rl_core.placement import LayoutRequest, plan_layout
from rl_core.placement.plan import RoleResource
from rl_core.weight_sync import (
    BroadcastSync,
    IpcSync,
    choose_weight_sync,
    colocated_ranks,
    group_ranks,
)


def _items() -> list[TrainItem]:
    return [
        TrainItem(tokens=[1, 5, 7, 9, 11], response_start=3, advantage=1.0, in_loss=True),
        TrainItem(tokens=[1, 6, 8, 10], response_start=2, advantage=-1.0, in_loss=True),
    ]


def test_trainer_offload_reuses_host_buffers_across_steps(tiny_model_path: Any) -> None:
    """The backend's offload set (weights, Adam state) goes into the same host memory every
    step; on CPU the backend itself moves nothing, so the offloader runs with the CPU standing
    in for the device — the same code the backend runs on a GPU."""
    backend = TorchHFBackend(tiny_model_path, BackendConfig(lr=1e-2))
    backend.train_step(_items(), old_logprobs=None)
    names = set(backend.offload_tensors())
    assert any(n.endswith(":exp_avg") for n in names)
    assert any(n.endswith(":exp_avg_sq") for n in names)
    host = HostOffloader(backend.offload_tensors, pin=False, include_cpu=True)
    first: dict[str, int] = {}
    for _ in range(2):
        host.offload()
        for name in names:
            buf = host.buffer(name)
            assert backend.offload_tensors()[name].data_ptr() == buf.data_ptr()
            assert first.setdefault(name, buf.untyped_storage().data_ptr()) == (
                buf.untyped_storage().data_ptr()
            )
        host.onload()
        backend.train_step(_items(), old_logprobs=None)
    assert set(backend.offload_tensors()) == names  # stable names: nothing re-allocated


def test_no_training_while_offloaded(tiny_model_path: Any) -> None:
    backend = TorchHFBackend(tiny_model_path, BackendConfig())
    backend.offload()
    with pytest.raises(RuntimeError, match="onload"):
        backend.train_step(_items(), old_logprobs=None)
    # the weights stay readable for a weight sync while offloaded
    assert [n for n, _ in backend.named_weights()]
    backend.onload()
    backend.train_step(_items(), old_logprobs=None)


# --- the state machine with recording fakes -----------------------------------------------------


class Ledger:
    """Who holds its memory right now; every fake checks the rule it depends on."""

    def __init__(self) -> None:
        self.awake: set[str] = {"rollout", "judge", "actor"}
        self.events: list[str] = []


class FakeEngine:
    def __init__(self, name: str, ledger: Ledger) -> None:
        self.name, self.ledger, self.version = name, ledger, 0

    async def sleep(self) -> None:
        self.ledger.awake.discard(self.name)
        self.ledger.events.append(f"{self.name}.sleep")

    async def wake(self) -> None:
        # a role wakes only after the roles it shares the GPU with went to sleep
        if self.name != "actor":
            assert "actor" not in self.ledger.awake, f"{self.name} woke beside the trainer"
        self.ledger.awake.add(self.name)
        self.ledger.events.append(f"{self.name}.wake")

    def generate(self) -> None:
        if self.name not in self.ledger.awake:
            raise AssertionError(f"generate on {self.name} while asleep")

    def update(self, version: int) -> None:
        if self.name not in self.ledger.awake:
            raise AssertionError(f"weights into {self.name} while asleep")
        if version <= self.version:
            raise AssertionError(f"{self.name}: version {version} after {self.version}")
        self.version = version


class FakeTrainer(FakeEngine):
    async def wake(self) -> None:
        engines = self.ledger.awake - {"actor"}
        assert not engines, f"trainer onloads while {sorted(engines)} hold the shared GPUs"
        self.ledger.awake.add("actor")
        self.ledger.events.append("actor.wake")

    def train(self) -> None:
        assert "actor" in self.ledger.awake, "training while offloaded"
        assert self.ledger.awake == {"actor"}, f"training beside awake {self.ledger.awake}"


def _shared_plan(**extra: Any) -> Any:
    judge = InstanceSpec(
        route_key="__default__",
        model_path="scripted",
        num_gpus=2,
        engine="scripted",
        engine_config=EngineConfig(mem_fraction_static=0.3),
    )
    return plan_layout(
        LayoutRequest(
            resource={r: RoleResource(groups=1, gpus_per_group=2) for r in extra.pop("roles")},
            genrm={"__default__": judge},
            **extra,
        )
    )


SHARED = {
    "roles": ("actor", "rollout", "genrm"),
    "colocate": True,
    "rollout_mem_fraction_static": 0.6,
    "rm_type": "dapo-genrm",
}


@pytest.mark.parametrize("steps", [3])
async def test_phases_hand_the_shared_gpus_back_and_forth(steps: int) -> None:
    plan = _shared_plan(**SHARED)
    assert plan.mode == "colocate-shared"
    ledger = Ledger()
    rollout, judge = FakeEngine("rollout", ledger), FakeEngine("judge", ledger)
    actor = FakeTrainer("actor", ledger)
    machine = PhaseMachine(
        phases_from_plan(plan),
        {"rollout": GroupSleeper([rollout]), "genrm:__default__": judge},
    )
    await machine.enter("train")  # start-up: engines sleep before the trainer loads
    machine.add("actor", actor)
    for step in range(1, steps + 1):  # the order of GRPOTrainer.run
        await machine.enter("inference")
        rollout.generate()
        judge.generate()
        with pytest.raises(AssertionError, match="training"):
            actor.train()
        await machine.enter("train")
        actor.train()
        with pytest.raises(AssertionError, match="while asleep"):
            rollout.generate()
        await machine.enter("inference")
        rollout.update(step)
    with pytest.raises(AssertionError, match="version"):
        rollout.update(steps)  # a version never goes back
    timings = machine.take_timings()
    assert {"offload/actor_s", "onload/actor_s", "sleep/rollout_s", "wake/rollout_s"} <= set(
        timings
    )
    assert machine.take_timings() == {}  # reset per step


# --- which path, and the syncs ------------------------------------------------------------------


def test_weight_path_follows_the_plan() -> None:
    shared = _shared_plan(**SHARED)
    assert colocated_ranks(shared) == [0, 1]
    assert choose_weight_sync(shared, use_gpus=True, device="auto", engine="hf") == "ipc"
    assert choose_weight_sync(shared, use_gpus=False, device="auto", engine="hf") == (
        "object_store"
    )
    assert choose_weight_sync(shared, use_gpus=True, device="cpu", engine="hf") == "object_store"
    # SGLang's scheduler maps the trainer's IPC buckets itself
    assert choose_weight_sync(shared, use_gpus=True, device="auto", engine="sglang") == "ipc"
    fully = _shared_plan(
        roles=("actor", "rollout", "genrm"), fully_async=True, rm_type="dapo-genrm"
    )
    assert fully.mode == "fully-async"
    assert colocated_ranks(fully) is None
    assert choose_weight_sync(fully, use_gpus=True, device="auto", engine="hf") == "broadcast"
    # SGLang's schedulers join the same broadcast group (init_weights_update_group)
    assert choose_weight_sync(fully, use_gpus=True, device="auto", engine="sglang") == "broadcast"
    # where NCCL cannot work, the object store stays
    assert choose_weight_sync(fully, use_gpus=False, device="auto", engine="sglang") == (
        "object_store"
    )
    assert choose_weight_sync(fully, use_gpus=True, device="cpu", engine="sglang") == (
        "object_store"
    )


def test_weight_group_ranks_follow_each_engines_size() -> None:
    """Trainer rank 0, then each engine's ranks: an SGLang engine of TP 2 takes two."""
    assert group_ranks([1, 1]) == ([1, 2], 3)
    assert group_ranks([2, 1, 4]) == ([1, 3, 4], 8)
    with pytest.raises(ValueError):
        group_ranks([1, 0])


async def test_broadcast_sync_gives_engines_their_first_ranks() -> None:
    joined: list[tuple[int, int]] = []

    class Learner:
        async def weight_group_address(self) -> tuple[str, int]:
            return "h", 1

        async def init_weight_group(self, host: str, port: int, world: int, backend: str) -> None:
            joined.append((0, world))

    class Engine:
        def __init__(self, ranks: int) -> None:
            self.ranks = ranks

        async def stats(self) -> dict[str, Any]:
            return {"weight_group_ranks": self.ranks}

        async def init_weight_group(
            self, host: str, port: int, rank: int, world: int, backend: str
        ) -> None:
            joined.append((rank, world))

    sync = BroadcastSync(Learner(), [Engine(2), Engine(1)])  # type: ignore[list-item]
    await sync.setup()
    assert sorted(joined) == [(0, 4), (1, 4), (3, 4)]

    class Silent(Engine):
        async def stats(self) -> dict[str, Any]:
            return {}

    # an engine that does not say its size is refused before anyone waits on the group
    joined.clear()
    silent = BroadcastSync(Learner(), [Engine(1), Silent(2)])  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match=r"engines \[1\] report no weight_group_ranks"):
        await silent.setup()
    assert joined == []


class FakeLearner:
    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self.held: set[tuple[int, int]] = set()
        self.released: list[int] = []

    async def weight_buckets(self, bucket_bytes: int, dtype: str, ranks: Any) -> list[str]:
        return [f"b{i}" for i in range(self.buckets)]

    async def export_bucket_ipc(self, rank: int, index: int) -> tuple[int, int]:
        self.held = {(r, i) for r, i in self.held if r != rank}  # one bucket per rank
        self.held.add((rank, index))
        return rank, index

    async def release_ipc(self, ranks: Any) -> None:
        self.released = list(ranks)


class IpcEngine(LocalEngineHandle):
    def __init__(self, name: str, lie: bool = False) -> None:
        self.name, self.lie, self.version = name, lie, 0
        self.calls: list[tuple[Any, int, bool]] = []

    async def update_weights_from_ipc(self, buckets: Any, version: int, done: bool) -> None:
        self.calls.append((buckets, version, done))
        if done and not self.lie:
            self.version = version

    async def weight_version(self) -> int:
        return self.version


async def test_ipc_sync_sends_each_engine_its_ranks_buckets_one_at_a_time() -> None:
    learner = FakeLearner(buckets=3)
    engines = [IpcEngine("r0"), IpcEngine("r1")]
    sync = IpcSync(learner, engines, ranks=[0, 1])
    await sync.sync(1)
    for rank, e in enumerate(engines):
        assert [c[0] for c in e.calls] == [[(rank, i)] for i in range(3)]
        assert [c[2] for c in e.calls] == [False, False, True]  # the version moves at the end
        assert e.version == 1
    assert learner.released == [0, 1]
    liar = IpcEngine("r0", lie=True)
    with pytest.raises(StaleWeightsError, match="serves weight version 0"):
        await IpcSync(learner, [liar], ranks=[0]).sync(2)
    assert learner.released == [0]  # buckets released even when the check fails


class WorkerLearner:
    """The trainer group's weight calls over one in-process TrainWorker (no Ray)."""

    def __init__(self, worker: TrainWorker) -> None:
        self.worker = worker

    async def weight_group_address(self) -> tuple[str, int]:
        return "127.0.0.1", free_port()

    async def init_weight_group(self, host: str, port: int, world: int, backend: str) -> None:
        await asyncio.to_thread(self.worker.init_weight_group, host, port, world, backend)

    async def weight_buckets(self, bucket_bytes: int, dtype: str, ranks: Any) -> list[Any]:
        return self.worker.weight_buckets(bucket_bytes, dtype)

    async def broadcast_weights(self) -> float:
        return await asyncio.to_thread(self.worker.broadcast_weights)


async def test_broadcast_sync_from_a_train_worker_into_the_hf_engine(tmp_path: Any) -> None:
    """fully-async's path on CPU (gloo): after a train step, the engine holds the trainer's
    exact weights and serves the new version — and a second step's sync follows."""
    model = build_tiny_model(tmp_path / "policy")
    worker = TrainWorker("actor", 0, 1, str(model), BackendConfig(lr=1e-2), device="cpu")
    worker.backend = TorchHFBackend(model, worker.cfg)
    spec = InstanceSpec(  # gloo: a CPU engine on any host (the NCCL path: test_gpu_weight_sync)
        route_key="rollout",
        model_path=str(model),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(device="cpu", dtype="float32"),  # compared exactly
    )
    engine = HFEngine(spec, "rollout/0")
    await engine.start()
    sync = BroadcastSync(
        WorkerLearner(worker),
        [LocalEngineHandle(engine)],
        bucket_bytes=64 * 1024,
        dtype="float32",
        backend="gloo",
    )
    await sync.setup()
    items = [TrainItem(tokens=[3, 5, 7, 9, 11, 13], response_start=3, advantage=1.0, in_loss=True)]
    for version in (1, 2):
        worker.backend.train_step(items, old_logprobs=None)
        await sync.sync(version)
        assert engine.weight_version == version
        served = dict(engine.model.named_parameters())
        for name, p in worker.backend.named_weights():
            torch.testing.assert_close(served[name], p, rtol=0, atol=0)
    assert len(worker._buckets) > 1  # it really went in several buckets
