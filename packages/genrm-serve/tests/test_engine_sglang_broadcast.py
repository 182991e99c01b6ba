"""The SGLang engine's weight path across GPUs, against the fake SGLang: the group it joins (ranks,
name) and what it asks SGLang's receiver for, checked against what the trainer's
``WeightBroadcastGroup`` sends. No NCCL here: the transfer itself is
``test_engine_sglang_gpu.py``'s."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from genrm_serve.config import EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineAsleepError, EngineError
from genrm_serve.engines.sglang import SGLangEngine
from genrm_serve.engines.sglang.weights import distributed_bucket_request
from genrm_serve.engines.weights import (
    WEIGHT_GROUP_NAME,
    WeightBroadcastGroup,
    pack_bucket,
    plan_buckets,
)
from genrm_serve.testing import FakeSGLangEngine, build_tiny_model, free_port


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _engine(tiny_dir: Path, per_engine: int = 1) -> SGLangEngine:
    spec = InstanceSpec(
        route_key="rollout",
        model_path=str(tiny_dir),
        num_gpus=per_engine,
        num_gpus_per_engine=per_engine,
        engine="sglang",
        engine_config=EngineConfig(),
    )
    return SGLangEngine(spec, "rollout/0", engine_cls=FakeSGLangEngine)


def _named(tiny_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    return {n: p.detach() for n, p in model.named_parameters()}


async def test_joins_the_group_as_one_rank_per_tp_rank(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from genrm_serve.engines.sglang import launch

    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(launch, "_assigned_gpus", lambda: [0])
    engine = _engine(tiny_dir, per_engine=2)
    await engine.start()
    fake: FakeSGLangEngine = engine.sgl
    assert engine.weight_group_ranks == 2
    assert engine.stats()["weight_group_ranks"] == 2
    await engine.init_weight_group("10.0.0.1", 29555, 3, 5, "nccl")
    assert fake.weight_groups == {
        WEIGHT_GROUP_NAME: {
            "address": ("10.0.0.1", 29555),
            "ranks": [3, 4],
            "world_size": 5,
            "backend": "nccl",
        }
    }
    # a TP rank past the group's end is refused before SGLang would hang or fail
    with pytest.raises(EngineError, match="do not fit"):
        await engine.init_weight_group("10.0.0.1", 29555, 4, 5, "nccl")
    await engine.shutdown()


async def test_each_bucket_is_one_flattened_receive_in_order(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir)
    await engine.start()
    fake: FakeSGLangEngine = engine.sgl
    buckets = plan_buckets(_named(tiny_dir).items(), bucket_bytes=64 * 1024)
    assert len(buckets) > 1
    with pytest.raises(EngineError, match="no weight group"):
        await engine.update_weights_from_broadcast(buckets, 1)
    assert fake.distributed_updates == []

    await engine.init_weight_group("127.0.0.1", 29555, 1, 2, "nccl")
    engine.wake_check.reference = object()  # type: ignore[assignment]  # as after a sleep
    await engine.update_weights_from_broadcast(buckets, 1)
    assert engine.wake_check.reference is None  # the old weights' probe is no proof any more
    assert engine.weight_version == 1
    updates = fake.distributed_updates
    assert [u["names"] for u in updates] == [[t.name for t in b.tensors] for b in buckets]
    assert all(u["group_name"] == WEIGHT_GROUP_NAME for u in updates)
    assert all(u["load_format"] == "flattened_bucket" for u in updates)
    assert all(u["dtypes"] == ["bfloat16"] * len(u["names"]) for u in updates)
    # what SGLang receives: one uint8 broadcast of the bucket's bytes per bucket
    assert [u["received"] for u in updates] == [[("uint8", b.nbytes)] for b in buckets]
    assert [u["flush_cache"] for u in updates] == [False] * (len(buckets) - 1) + [True]

    with pytest.raises(EngineError, match="must be greater"):
        await engine.update_weights_from_broadcast(buckets, 1)
    await engine.sleep()
    with pytest.raises(EngineAsleepError):
        await engine.update_weights_from_broadcast(buckets, 2)
    assert len(fake.distributed_updates) == len(buckets)
    await engine.shutdown()


async def test_a_failed_receive_is_an_error_and_keeps_the_version(tiny_dir: Path) -> None:
    engine = _engine(tiny_dir)
    await engine.start()
    await engine.init_weight_group("127.0.0.1", 29555, 1, 2, "nccl")
    bad = plan_buckets([("w", torch.zeros(2))], dtype=torch.bfloat16)
    bad = [type(bad[0])("not_a_dtype", bad[0].numel, bad[0].tensors)]
    with pytest.raises(EngineError, match="update_weights_from_distributed failed"):
        await engine.update_weights_from_broadcast(bad, 1)
    assert engine.weight_version == 0
    await engine.shutdown()


def test_the_trainer_sends_each_bucket_as_the_bytes_sglang_receives(tiny_dir: Path) -> None:
    """Rank 0's ``WeightBroadcastGroup.broadcast`` against a receiver that posts what SGLang's
    flattened-bucket receiver posts: one uint8 buffer of the bucket's bytes, the tensors cut from
    it in order, each viewed as the bucket's dtype."""
    named = _named(tiny_dir)
    buckets = plan_buckets(named.items(), bucket_bytes=64 * 1024, dtype=torch.bfloat16)
    port = free_port()
    received: list[torch.Tensor] = []

    def rank0() -> None:
        group = WeightBroadcastGroup("127.0.0.1", port, 0, 2, backend="gloo")
        for b in buckets:
            group.broadcast(pack_bucket(b, named))

    sender = threading.Thread(target=rank0)
    sender.start()
    group = WeightBroadcastGroup("127.0.0.1", port, 1, 2, backend="gloo")
    import torch.distributed as dist

    for b in buckets:
        raw = torch.empty(b.nbytes, dtype=torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        group.pg.broadcast([raw], opts).wait()
        received.append(raw)
    sender.join(30)
    for b, raw in zip(buckets, received, strict=True):
        start = 0
        for t in b.tensors:
            nbytes = t.numel * 2
            got = raw[start : start + nbytes].view(torch.bfloat16).view(t.shape)
            torch.testing.assert_close(got, named[t.name].to(torch.bfloat16), rtol=0, atol=0)
            start += nbytes


async def test_a_receive_without_a_joined_group_never_reaches_sglang(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's receiver asserts that its group exists, outside its try (the scheduler dies of
    it): the engine refuses a receive before any join, and after a join SGLang answered
    ``(False, message)`` to, without calling the receiver; once joined, the receive names the
    group SGLang joined."""
    engine = _engine(tiny_dir)
    await engine.start()
    fake: FakeSGLangEngine = engine.sgl
    buckets = plan_buckets([("w", torch.zeros(2))], dtype=torch.bfloat16)
    try:
        with pytest.raises(EngineError, match="no weight group"):
            await engine.update_weights_from_broadcast(buckets, 1)
        refused = (False, "Failed to initialize custom process group: timed out")
        monkeypatch.setattr(fake, "init_weights_update_group", lambda **_: refused)
        with pytest.raises(EngineError, match="init_weights_update_group failed: Failed"):
            await engine.init_weight_group("127.0.0.1", 29555, 1, 2, "nccl")
        with pytest.raises(EngineError, match="no weight group"):
            await engine.update_weights_from_broadcast(buckets, 1)
        assert "update_weights_from_distributed" not in fake.calls
        assert engine.weight_version == 0
        monkeypatch.undo()
        await engine.init_weight_group("127.0.0.1", 29555, 1, 2, "nccl")
        await engine.update_weights_from_broadcast(buckets, 1)
        (update,) = fake.distributed_updates
        assert update["group_name"] == WEIGHT_GROUP_NAME and engine.weight_version == 1
    finally:
        await engine.shutdown()


def test_a_bucket_is_asked_for_as_one_flattened_receive() -> None:
    """Without ``load_format="flattened_bucket"`` SGLang's receiver posts one broadcast per
    tensor, which the trainer does not send: every request names it."""
    (bucket,) = plan_buckets(
        [("a", torch.zeros(2, 3)), ("b", torch.zeros(4))], dtype=torch.bfloat16
    )
    assert distributed_bucket_request(bucket, "g", flush_cache=True) == {
        "names": ["a", "b"],
        "dtypes": ["bfloat16", "bfloat16"],
        "shapes": [[2, 3], [4]],
        "group_name": "g",
        "flush_cache": True,
        "load_format": "flattened_bucket",
    }
