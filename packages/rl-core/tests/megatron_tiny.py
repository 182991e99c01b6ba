"""Tiny random HF checkpoints (Qwen3, Llama) for the Megatron backend tests."""

from __future__ import annotations

from pathlib import Path

import torch


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


def hf_model(cfg, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    # Norm gains are 1 at init: randomise them so a swapped norm would show in the round trip.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


def save_hf_model(cfg, path: Path, seed: int = 0) -> Path:
    hf_model(cfg, seed).save_pretrained(path)
    return path
