"""Tiny random HF checkpoints (Qwen3, Llama) for the Megatron backend tests."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from rl_core.backends.base import TrainItem


def qwen3_config(tied: bool = False):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
    )


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=96,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )


def llama3_rope_config():
    """Llama with Llama 3's RoPE scaling: at head_dim 8 and θ 5e5 the slowest frequency's
    wavelength (≈ 19k) is past the low-frequency cut (8192), so the scaling changes RoPE."""
    cfg = llama_config()
    cfg.rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    return cfg


def qwen2_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def hf_model(cfg, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Norm gains are 1 at init: randomise them so a swapped norm would show in the round trip.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # norm gains and, for Qwen2, the q/k/v biases (zero at init)
                p.uniform_(0.5, 1.5)
    return model


def save_hf_model(cfg, path: Path, seed: int = 0) -> Path:
    hf_model(cfg, seed).save_pretrained(path)
    return path


def train_items():
    """Four samples of different lengths and advantages (packs into 2-3 per micro-batch)."""
    return [
        TrainItem(tokens=[1, 5, 6, 7, 8, 9], response_start=3, advantage=1.0, in_loss=True),
        TrainItem(tokens=[1, 5, 6, 10, 11], response_start=3, advantage=-1.0, in_loss=True),
        TrainItem(
            tokens=[1, 4, 12, 13, 14, 15, 16, 40, 41], response_start=2, advantage=0.5, in_loss=True
        ),
        TrainItem(tokens=[1, 7, 30, 31, 32], response_start=2, advantage=-0.5, in_loss=True),
    ]


def two_rank_worker(rank, world, port, path, mode, out):
    """One rank of a gloo world of two (spawned; lives here so the child can import it)."""
    import torch.distributed as dist

    from rl_core.backends.base import BackendConfig
    from rl_core.backends.megatron.backend import MegatronBackend
    from rl_core.backends.megatron.parallel import MegatronConfig

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = BackendConfig(
            lr=0.05, adam_eps=1.0, clip_grad=1e9, max_tokens_per_micro_batch=12, temperature=0.8
        )
        items = train_items()
        if mode == "tp":
            b = MegatronBackend(
                path, cfg, MegatronConfig(tensor_model_parallel_size=2), device="cpu"
            )
            result = {"logprobs": b.logprobs(items)}
            metrics = b.train_step(items, old_logprobs=None)
        else:  # dp: each rank trains on half of the batch, normalised by the global tokens
            b = MegatronBackend(path, cfg, device="cpu")
            mine = items[rank::2]
            total = float(sum(it.response_len for it in items))
            result = {}
            metrics = b.train_step(mine, old_logprobs=None, total_tokens=total)
        # each data-parallel rank reports its share of the loss: the group sums them
        losses = [0.0] * world
        dist.all_gather_object(losses, metrics["loss"])
        loss = sum(losses) if mode == "dp" else losses[0]
        weights = b.export_weights()
        result.update(grad_norm=metrics["grad_norm"], weights=weights, loss=loss)
        if mode == "tp":  # a TP checkpoint: collective save, every rank loads its shard back
            ckpt = Path(out).parent / "tp-ckpt"
            b.save(ckpt, {"cursor": 7})
            again = MegatronBackend(
                path, cfg, MegatronConfig(tensor_model_parallel_size=2), device="cpu"
            )
            result["reloaded_extra"] = again.load(ckpt)
            result["reloaded_step"] = again.step
            result["reloaded_equal"] = all(
                torch.equal(v, weights[k]) for k, v in again.export_weights().items()
            )
            again.close()
        if mode == "dp":
            # the distributed optimizer: each rank holds the Adam state of about half the model
            counts = [0] * world
            mine_numel = sum(st["exp_avg"].numel() for st in b.optimizer.optimizer.state.values())
            dist.all_gather_object(counts, mine_numel)
            result["adam_numels"] = counts
            result["model_numel"] = sum(p.numel() for p in b.model.parameters())
            # a checkpoint of the shards: save (collective), load into fresh ranks, step again
            ckpt = Path(out).parent / "dp-ckpt"
            b.save(ckpt, {"cursor": 5})
            again = MegatronBackend(path, cfg, device="cpu")
            result["reloaded_extra"] = again.load(ckpt)
            for backend in (b, again):
                backend.train_step(mine, old_logprobs=None, total_tokens=total)
            after = b.export_weights()
            result["resumed_equal"] = all(
                torch.equal(v, after[k]) for k, v in again.export_weights().items()
            )
            again.close()
        b.close()
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()
