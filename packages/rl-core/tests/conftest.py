"""Shared fixtures: a tiny random-weight causal LM saved to disk (seconds to build, MBs of RAM)."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import pytest
import torch


def build_tiny_model(path, vocab_size=96, seed=0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        sliding_window=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Gemma3ForCausalLM(cfg)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
