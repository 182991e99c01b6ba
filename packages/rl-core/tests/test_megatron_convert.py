"""HF ↔ Megatron weight conversion: exact round trips, TP shards laid out as Megatron's."""

import pytest
import torch
from megatron_tiny import hf_model, llama_config, qwen2_config, qwen3_config

from rl_core.backends.megatron.config import model_args_from_hf
from rl_core.backends.megatron.convert import hf_to_megatron, megatron_to_hf

CONFIGS = {
    "qwen3": lambda: qwen3_config(tied=False),
    "qwen3-tied": lambda: qwen3_config(tied=True),
    "llama": llama_config,
    "qwen2": qwen2_config,  # q/k/v biases, interleaved like the weights
}


def _hf(name):
    cfg = CONFIGS[name]()
    model = hf_model(cfg)
    return model_args_from_hf(cfg), dict(model.named_parameters())


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("fused_norms", [False, True], ids=["local-spec", "te-spec"])
def test_round_trip_is_exact(name, tp, fused_norms):
    args, hf = _hf(name)
    shards = hf_to_megatron(hf, args, tp, fused_norms=fused_norms)
    assert len(shards) == tp
    back = megatron_to_hf(shards, args, fused_norms=fused_norms)
    # named_parameters names a tied embedding once: so must the conversion.
    assert set(back) == set(hf)
    for k, v in hf.items():
        assert back[k].shape == v.shape and torch.equal(back[k], v), k


def test_tp_shards_interleave_qkv_per_query_group():
    """Rank r's linear_qkv = for each of its KV groups: that group's q heads, k head, v head."""
    args, hf = _hf("qwen3")  # 4 heads, 2 KV groups, head_dim 16: 2 q heads per group
    d, hpg = args.head_dim, args.heads_per_group
    q, k, v = (hf[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    shards = hf_to_megatron(hf, args, 2)
    for rank, shard in enumerate(shards):  # one group per rank
        g = rank
        want = torch.cat(
            [q[g * hpg * d : (g + 1) * hpg * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]
        )
        assert torch.equal(shard["decoder.layers.1.self_attention.linear_qkv.weight"], want)


def test_tp_shards_split_swiglu_and_row_parallel_layers():
    args, hf = _hf("llama")
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    down, o = (
        hf["model.layers.0.mlp.down_proj.weight"],
        hf["model.layers.0.self_attn.o_proj.weight"],
    )
    half = args.ffn_hidden_size // 2
    for rank, shard in enumerate(hf_to_megatron(hf, args, 2)):
        rows = slice(rank * half, (rank + 1) * half)
        # fc1 shard is [gate shard; up shard], not a slice of [gate; up]
        assert torch.equal(
            shard["decoder.layers.0.mlp.linear_fc1.weight"], torch.cat([gate[rows], up[rows]])
        )
        # row parallel: the input dimension is split
        assert torch.equal(shard["decoder.layers.0.mlp.linear_fc2.weight"], down[:, rows])
        cols = o.shape[1] // 2
        assert torch.equal(
            shard["decoder.layers.0.self_attention.linear_proj.weight"],
            o[:, rank * cols : (rank + 1) * cols],
        )
        # norms are replicated, the vocabulary split
        assert torch.equal(shard["decoder.final_layernorm.weight"], hf["model.norm.weight"])
        vocab = args.vocab_size // 2
        assert torch.equal(
            shard["output_layer.weight"], hf["lm_head.weight"][rank * vocab : (rank + 1) * vocab]
        )


def test_tied_model_has_no_output_layer():
    args, hf = _hf("qwen3-tied")
    (shard,) = hf_to_megatron(hf, args, 1)
    assert "output_layer.weight" not in shard
    assert "lm_head.weight" not in megatron_to_hf([shard], args)


def test_missing_hf_weight_is_named():
    args, hf = _hf("qwen3")
    del hf["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(KeyError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight"):
        hf_to_megatron(hf, args, 1)
