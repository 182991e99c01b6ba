"""The training backends on a CUDA GPU in bf16: Megatron-core against the torch backend on the same
HF weights and batch, both backends' offload / onload of weights and Adam state, and the torch
backend's resume from its checkpoint.

No CUDA patches here (the CPU tests in ``test_megatron_backend.py`` need them): the Megatron
backend starts its own NCCL group of world size 1 and ``initialize_model_parallel(1, 1)``, as on
a training GPU, and ``close()`` ends both. Skipped without CUDA (the root conftest).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rl_core.backends.base import BackendConfig, TrainItem
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.grpo.loss import LossConfig, grpo_loss

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

VOCAB = 151_936


def _qwen3_checkpoint(path: Path) -> Path:
    """A small random Qwen3 (2 layers × 256, tied embeddings, Qwen3's vocabulary) in HF format;
    norm gains randomised so that a swapped norm would show."""
    from megatron_tiny import hf_model
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    hf_model(cfg, seed=0).save_pretrained(path)
    return path


def _batch() -> list[TrainItem]:
    """Eight 96-token samples (32 prompt + 64 response tokens), advantages ±1."""
    g = torch.Generator().manual_seed(1)
    return [
        TrainItem(
            tokens=torch.randint(0, 5000, (96,), generator=g).tolist(),
            response_start=32,
            advantage=1.0 if i % 2 else -1.0,
            in_loss=True,
        )
        for i in range(8)
    ]


def _cfg() -> BackendConfig:
    return BackendConfig(lr=1e-3, bf16=True, max_tokens_per_micro_batch=512)


def _loss(logps: list[torch.Tensor], old: list[torch.Tensor], items: list[TrainItem]) -> float:
    lp, ol = torch.cat(logps).float().cpu(), torch.cat(old).float().cpu()
    adv = torch.cat([torch.full((it.response_len,), it.advantage) for it in items])
    return float(
        grpo_loss(lp, ol, adv, torch.ones_like(lp), LossConfig(), total_tokens=len(lp)).loss
    )


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-gpu"))


@pytest.fixture
def megatron_backend(qwen3_path: Path) -> Iterator[Any]:
    pytest.importorskip("megatron.core", reason="megatron-core (the [megatron] extra) is absent")
    from rl_core.backends.megatron.backend import MegatronBackend

    backend = MegatronBackend(qwen3_path, _cfg(), device="cuda")
    yield backend
    backend.close()
    del backend
    torch.cuda.empty_cache()


def test_megatron_and_torch_agree_in_bf16_and_one_step_lowers_the_loss(
    qwen3_path: Path, megatron_backend: Any
) -> None:
    items = _batch()
    torch_backend = TorchHFBackend(qwen3_path, _cfg(), device="cuda")
    assert torch_backend.bf16 and megatron_backend.bf16
    assert torch.distributed.get_backend() == "nccl"
    want = torch_backend.logprobs(items)
    got = megatron_backend.logprobs(items)
    for w, g, it in zip(want, got, items, strict=True):
        assert g.shape == w.shape == (it.response_len,)
    diff = (torch.cat(got).float().cpu() - torch.cat(want).float().cpu()).abs()
    assert diff.max() <= 2e-2 and diff.mean() <= 2e-3, (float(diff.max()), float(diff.mean()))
    for name, b in (("torch", torch_backend), ("megatron", megatron_backend)):
        old = b.logprobs(items)
        metrics = b.train_step(items, old_logprobs=old)
        assert metrics["train_tokens"] == 8 * 64, name
        assert torch.isfinite(torch.tensor(metrics["grad_norm"])), name
        new = b.logprobs(items)
        assert _loss(new, old, items) < _loss(old, old, items), name
    del torch_backend
    torch.cuda.empty_cache()


def test_torch_backend_offload_frees_weights_and_adam_state_and_reuses_host_buffers(
    qwen3_path: Path,
) -> None:
    items = _batch()
    backend = TorchHFBackend(qwen3_path, _cfg(), device="cuda")
    backend.train_step(items, old_logprobs=None)  # Adam state exists from here on
    every = set(backend.offload_tensors())
    # what lives on the GPU moves to host buffers (Adam's step counter is a CPU scalar: it stays)
    names = {n for n, t in backend.offload_tensors().items() if t.is_cuda}
    assert any(n.endswith(":exp_avg_sq") for n in names)
    storages: dict[str, int] = {}
    for _ in range(2):
        on_gpu = [t for t in backend.offload_tensors().values() if t.is_cuda]
        moved = sum(t.numel() * t.element_size() for t in on_gpu)
        del on_gpu
        torch.cuda.synchronize()
        loaded = torch.cuda.memory_allocated()
        backend.offload()
        offloaded = torch.cuda.memory_allocated()
        assert loaded - offloaded >= moved - (1 << 20), (loaded, offloaded, moved)
        assert all(not t.is_cuda for t in backend.offload_tensors().values())
        with pytest.raises(RuntimeError, match="onload"):
            backend.train_step(items, old_logprobs=None)
        for name in names:
            ptr = backend._host.buffer(name).untyped_storage().data_ptr()
            assert storages.setdefault(name, ptr) == ptr, name  # the same host memory
        backend.onload()
        assert all(p.is_cuda for p in backend.model.parameters())
        metrics = backend.train_step(items, old_logprobs=None)
        assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert set(backend.offload_tensors()) == every
    backend._host.close()
    del backend
    torch.cuda.empty_cache()


def test_megatron_offload_frees_its_buffers_and_adam_state_and_syncs_from_the_host(
    megatron_backend: Any,
) -> None:
    """Offload moves DDP's parameter buffer and the Adam shard to pinned host memory and frees
    the gradient buffer; while offloaded, the weights a sync reads are the trained ones (from
    the host copy); after onload the next step trains from exactly where it stopped."""
    items = _batch()
    b = megatron_backend
    b.train_step(items, old_logprobs=None)  # DDP buffers and Adam state exist from here on
    trained = b.export_weights()
    params = sum(p.numel() for p in b.model.parameters())
    torch.cuda.synchronize()
    loaded = torch.cuda.memory_allocated()
    b.offload()
    freed = loaded - torch.cuda.memory_allocated()
    # fp32 parameters + fp32 gradients + exp_avg + exp_avg_sq: 16 bytes a parameter (world 1)
    assert freed >= 16 * params - (8 << 20), (freed, 16 * params)
    with pytest.raises(RuntimeError, match="onload"):
        b.train_step(items, old_logprobs=None)
    named = dict(b.named_weights())
    assert all(not t.is_cuda for t in named.values())
    for k, v in trained.items():
        assert torch.equal(named[k].cpu(), v), k
    b.onload()
    for k, v in b.export_weights().items():
        assert torch.equal(v, trained[k]), k
    metrics = b.train_step(items, old_logprobs=None)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0


def test_torch_backend_resumes_on_the_gpu_where_it_saved(qwen3_path: Path, tmp_path: Path) -> None:
    """What a restart from a checkpoint does on a training GPU: weights and Adam state come back
    exactly, on the device, and training goes on (on a GPU the saved RNG state once loaded onto
    the device, and every resume failed). Exact after the load; the next step is not compared
    bit for bit (CUDA's embedding backward adds in no fixed order)."""
    items = _batch()
    cfg = _cfg()
    first = TorchHFBackend(qwen3_path, cfg, device="cuda")
    first.train_step(items, old_logprobs=None)
    first.save(tmp_path / "ckpt", {"cursor": 3})
    weights = {k: v.detach().cpu() for k, v in first.model.state_dict().items()}
    adam = {
        (i, k): t.cpu()
        for i, s in enumerate(first.optimizer.state_dict()["state"].values())
        for k, t in s.items()
    }
    del first
    torch.cuda.empty_cache()

    resumed = TorchHFBackend(qwen3_path, cfg, device="cuda")
    assert resumed.load(tmp_path / "ckpt") == {"cursor": 3} and resumed.step == 1
    for k, v in resumed.model.state_dict().items():
        assert v.is_cuda and torch.equal(v.cpu(), weights[k]), k
    state = resumed.optimizer.state_dict()["state"]
    got = {(i, k): t for i, s in enumerate(state.values()) for k, t in s.items()}
    assert got.keys() == adam.keys()
    for key, t in got.items():
        assert torch.equal(t.cpu(), adam[key]), key
        assert t.is_cuda or t.dim() == 0, key  # Adam's step counter is a CPU scalar
    metrics = resumed.train_step(items, old_logprobs=None)
    assert resumed.step == 2 and torch.isfinite(torch.tensor(metrics["loss"]))
    del resumed
    torch.cuda.empty_cache()
