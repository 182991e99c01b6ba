"""Moving weights: host buffers reused across offloads, flat buckets, the broadcast path into the
hf engine, and the memory share of ``mem_fraction_static`` (CPU; CUDA IPC is GPU-only and is
measured by benchmarks/gpu_handoff.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import torch

from genrm_serve.config import EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineError
from genrm_serve.engines.hf import HFEngine, batch_token_budget, model_bytes, share_budget
from genrm_serve.engines.weights import (
    HostOffloader,
    WeightBroadcastGroup,
    _group_store,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)
from genrm_serve.testing import build_tiny_model, free_port


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _model(tiny_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    return model


def _adam_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    loss = model(input_ids=torch.tensor([[1, 5, 9, 13]])).logits.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_offload_reuses_the_same_host_buffers_every_step(tiny_dir: Path) -> None:
    model = _model(tiny_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _adam_step(model, opt)

    def tensors() -> dict[str, torch.Tensor]:
        out = {f"param:{n}": p for n, p in model.named_parameters()}
        for i, state in enumerate(opt.state.values()):
            out |= {f"optim:{i}:{k}": v for k, v in state.items() if k != "step"}
        return out

    # include_cpu: the CPU stands in for the device, so the buffer logic runs here as on a GPU
    host = HostOffloader(tensors, pin=False, include_cpu=True)
    storages: dict[str, int] = {}
    for step in range(3):
        expected = {n: t.detach().clone() for n, t in tensors().items()}
        host.offload()
        for name, t in tensors().items():
            buf = host.buffer(name)
            # the live tensor now *is* the host buffer, and holds its values
            assert t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
            torch.testing.assert_close(buf, expected[name], rtol=0, atol=0)
            storages.setdefault(name, buf.data_ptr())
            assert buf.data_ptr() == storages[name], f"{name}: new host buffer at step {step}"
        host.onload()
        for name, t in tensors().items():
            assert t.data_ptr() != host.buffer(name).data_ptr()  # back in its own memory
            torch.testing.assert_close(t, expected[name], rtol=0, atol=0)
        _adam_step(model, opt)  # training goes on with the onloaded tensors
    assert host.host_bytes == sum(t.numel() * t.element_size() for t in tensors().values())


def test_reserve_allocates_the_buffers_the_first_offload_then_uses() -> None:
    t = {"w": torch.arange(6.0), "b": torch.ones(3)}
    host = HostOffloader(lambda: t, pin=False, include_cpu=True)
    host.reserve()
    assert not host.offloaded and host.host_bytes == 9 * 4
    reserved = {n: host.buffer(n).data_ptr() for n in t}
    assert all(t[n].data_ptr() != reserved[n] for n in t)  # nothing moved
    host.offload()
    assert {n: t[n].data_ptr() for n in t} == reserved  # the live tensors are those buffers
    torch.testing.assert_close(t["w"], torch.arange(6.0), rtol=0, atol=0)
    assert host.host_bytes == 9 * 4  # no second allocation


def test_in_place_tensors_free_their_storage_and_keep_their_views() -> None:
    """A flat buffer that parameters are views of (Megatron DDP's): offload frees its memory
    without re-binding it, so after onload the same views see the same values."""
    flat = torch.arange(10.0)
    w, b = flat[:6].view(2, 3), flat[6:]
    adam = {"m": torch.full((4,), 2.0)}
    host = HostOffloader(lambda: adam, in_place=lambda: {"flat": flat}, pin=False, include_cpu=True)
    host.offload()
    assert flat.untyped_storage().nbytes() == 0  # the memory is gone; the tensor object stays
    torch.testing.assert_close(host.buffer("flat"), torch.arange(10.0), rtol=0, atol=0)
    assert adam["m"].data_ptr() == host.buffer("m").data_ptr()  # the others are re-bound
    host.onload()
    torch.testing.assert_close(w, torch.arange(6.0).view(2, 3), rtol=0, atol=0)
    b.add_(1)  # still views of the buffer
    assert flat[6].item() == 7.0
    assert host.host_bytes == (10 + 4) * 4
    with pytest.raises(RuntimeError, match="not its whole storage"):
        HostOffloader(dict, in_place=lambda: {"w": w[1]}, pin=False, include_cpu=True).offload()


def test_offload_refuses_a_tensor_that_changed_shape() -> None:
    t = {"w": torch.zeros(4)}
    host = HostOffloader(lambda: t, pin=False, include_cpu=True)
    host.offload()
    host.onload()
    t["w"] = torch.zeros(5)
    with pytest.raises(RuntimeError, match="changed shape"):
        host.offload()


def test_buckets_hold_every_tensor_once_within_the_size() -> None:
    g = torch.Generator().manual_seed(0)
    named = [(f"t{i}", torch.randn(n, generator=g)) for i, n in enumerate([10, 300, 7, 90, 600])]
    buckets = plan_buckets(named, bucket_bytes=400 * 2, dtype=torch.bfloat16)
    assert [tm.name for b in buckets for tm in b.tensors] == [n for n, _ in named]
    for b in buckets:  # only a tensor larger than a bucket gets one of its own, over the size
        assert b.nbytes <= 800 or len(b.tensors) == 1
    assert [len(b.tensors) for b in buckets] == [3, 1, 1]  # 317 ≤ 400; 90 + 600 > 400
    source = dict(named)
    for b in buckets:
        flat = pack_bucket(b, source)
        assert flat.dtype == torch.bfloat16 and flat.numel() == b.numel
        for name, view in unpack_bucket(flat, b).items():
            torch.testing.assert_close(view, source[name].to(torch.bfloat16), rtol=0, atol=0)
    with pytest.raises(ValueError, match="bucket is"):
        unpack_bucket(torch.zeros(3, dtype=torch.bfloat16), buckets[0])


def _spec(path: Path, **cfg: object) -> InstanceSpec:
    return InstanceSpec(
        route_key="rollout",
        model_path=str(path),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(**cfg),  # type: ignore[arg-type]
    )


def test_broadcast_puts_the_trainers_weights_into_the_engine(tiny_dir: Path) -> None:
    """Trainer rank 0 broadcasts fp32 buckets over gloo; the engine then holds exactly its
    weights and serves the new version; an old version is refused."""
    trainer = _model(tiny_dir)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.1)
    buckets = plan_buckets(trainer.named_parameters(), 4096, torch.float32)
    assert len(buckets) > 1
    port = free_port()

    async def run() -> HFEngine:
        engine = HFEngine(
            _spec(tiny_dir, device="cpu", dtype="float32"), "rollout/0"
        )  # gloo: CPU, any host
        await engine.start()
        before = dict(engine.model.named_parameters())
        assert not torch.equal(
            before["model.embed_tokens.weight"], trainer.get_input_embeddings().weight
        )

        def rank0() -> None:
            group = WeightBroadcastGroup("127.0.0.1", port, 0, 2, backend="gloo")
            named = dict(trainer.named_parameters())
            for b in buckets:
                group.broadcast(pack_bucket(b, named))

        sender = threading.Thread(target=rank0)
        sender.start()
        await engine.init_weight_group("127.0.0.1", port, 1, 2, "gloo")
        await engine.update_weights_from_broadcast(buckets, 1)
        sender.join(30)
        with pytest.raises(EngineError, match="must be greater"):
            await engine.update_weights_from_broadcast(buckets, 1)
        return engine

    engine = asyncio.run(run())
    assert engine.weight_version == 1
    served = dict(engine.model.named_parameters())
    for name, p in trainer.named_parameters():
        torch.testing.assert_close(served[name], p, rtol=0, atol=0)
    assert "time_weight_update_s" in engine.stats()


def test_share_budget_from_mem_fraction(tiny_dir: Path) -> None:
    model = _model(tiny_dir)
    weights = model_bytes(model)
    total = 4 << 30
    small = share_budget(model, torch.bfloat16, 0.3, total, engine_id="judge/0")
    large = share_budget(model, torch.bfloat16, 0.6, total, engine_id="judge/0")
    assert small["weights_bytes"] == weights
    assert small["share_bytes"] == int(0.3 * total)
    free = small["share_bytes"] - weights - (1 << 30)
    assert small["tokens"] == batch_token_budget(model.config, torch.bfloat16, free)
    assert large["tokens"] > small["tokens"] > 0
    with pytest.raises(EngineError) as err:
        share_budget(model, torch.bfloat16, 0.2, 1 << 30, engine_id="judge/0")
    message = str(err.value)
    assert "mem_fraction_static=0.2" in message and "weights alone take" in message


def test_batch_budget_counts_kv_and_activations_per_token() -> None:
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
    per_token = (2 * 36 * 8 * 128 + 4 * 2560 + (32 + 16) * 128 + 3 * 9728) * 2
    assert batch_token_budget(cfg, torch.bfloat16, per_token * 1000) == 1000


def test_the_group_store_nests_prefixes_as_sglangs_side() -> None:
    """NCCL's members meet on the store keys under ``group_name`` / ``group_name/`` /
    ``cuda/`` (SGLang's ``init_custom_process_group`` through torch's group helper)."""
    import torch.distributed as dist

    port = free_port()
    base = dist.TCPStore("127.0.0.1", port, 1, True)  # type: ignore[attr-defined]
    _group_store(base, "g", "nccl").set("k", b"v")
    nested = dist.PrefixStore("cuda/", dist.PrefixStore("g/", dist.PrefixStore("g", base)))  # type: ignore[attr-defined]
    assert nested.get("k") == b"v"
