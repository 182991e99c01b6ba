"""HF config → Megatron model args; refusals; the parallel flags and their rule; the extra."""

import argparse
import builtins

import pytest
from megatron_tiny import llama3_rope_config, llama_config, qwen2_config, qwen3_config

from rl_core.backends.megatron import MEGATRON_EXTRA, MegatronNotInstalledError, require_megatron
from rl_core.backends.megatron.config import (
    UnsupportedModelError,
    check_tensor_parallel,
    gpt_model_kwargs,
    model_args_from_hf,
    transformer_config_kwargs,
)
from rl_core.backends.megatron.parallel import (
    MegatronConfig,
    ParallelConfigError,
    add_megatron_args,
    check_parallel_sizes,
    megatron_config_from,
)


def test_qwen3_maps_qk_norm_gqa_rope_and_tying():
    args = model_args_from_hf(qwen3_config(tied=True))
    assert (args.family, args.qk_layernorm, args.qkv_bias) == ("qwen3", True, False)
    tc = transformer_config_kwargs(args, tensor_model_parallel_size=2)
    assert tc["num_attention_heads"] == 4 and tc["num_query_groups"] == 2
    assert tc["kv_channels"] == 16 and tc["ffn_hidden_size"] == 64
    assert tc["normalization"] == "RMSNorm" and tc["gated_linear_unit"] and tc["qk_layernorm"]
    assert tc["tensor_model_parallel_size"] == 2 and tc["hidden_dropout"] == 0.0
    gm = gpt_model_kwargs(args)
    assert gm["share_embeddings_and_output_weights"] is True
    assert gm["rotary_base"] == 10000.0 and gm["position_embedding_type"] == "rope"
    assert model_args_from_hf(qwen3_config(tied=False)).tie_word_embeddings is False


def test_qwen3_1_7b_shape_from_its_config_json():
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "rope_theta": 1000000,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
        "hidden_act": "silu",
    }
    args = model_args_from_hf(cfg)
    assert (args.head_dim, args.heads_per_group, args.rope_theta) == (128, 2, 1e6)
    check_tensor_parallel(args, 8)
    with pytest.raises(UnsupportedModelError, match="num_key_value_heads 8"):
        check_tensor_parallel(args, 16)


def test_llama_dense_with_llama3_rope_scaling():
    cfg = llama_config().to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    args = model_args_from_hf(cfg)
    assert (args.family, args.qk_layernorm, args.head_dim, args.rope_theta) == (
        "llama",
        False,
        8,
        500000.0,
    )
    assert args.rope_scaling_factor is None
    cfg["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    cfg.pop("rope_parameters", None)
    assert model_args_from_hf(cfg).rope_scaling_factor == 32.0
    cfg["rope_scaling"]["high_freq_factor"] = 2.0
    with pytest.raises(UnsupportedModelError, match="high_freq_factor"):
        model_args_from_hf(cfg)


def test_transformers_5_rope_parameters_and_qwen2_biases():
    assert model_args_from_hf(llama3_rope_config()).rope_scaling_factor == 8.0
    qwen2 = model_args_from_hf(qwen2_config())
    assert (qwen2.family, qwen2.qkv_bias, qwen2.qk_layernorm) == ("qwen2", True, False)
    assert transformer_config_kwargs(qwen2)["add_qkv_bias"] is True


@pytest.mark.parametrize(
    ("change", "match"),
    [
        pytest.param(
            {"architectures": ["MixtralForCausalLM"]},
            "MixtralForCausalLM is not supported",
            id="moe",
        ),
        pytest.param(
            {"architectures": ["Gemma3ForCausalLM"]},
            "Gemma3ForCausalLM is not supported",
            id="gemma",
        ),
        pytest.param({"hidden_act": "gelu"}, "hidden_act='gelu'", id="activation"),
        pytest.param({"attention_bias": True}, "attention_bias=True", id="attention-bias"),
        pytest.param(
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'", id="yarn"
        ),
    ],
)
def test_unsupported_models_are_refused_by_name(change, match):
    cfg = {**qwen3_config().to_dict(), "architectures": ["Qwen3ForCausalLM"], **change}
    if "rope_scaling" in change:
        cfg.pop("rope_parameters", None)
    with pytest.raises(UnsupportedModelError, match=match):
        model_args_from_hf(cfg)


def test_flags_parse_into_the_config_model():
    parser = argparse.ArgumentParser()
    add_megatron_args(parser)
    ns = parser.parse_args(
        [
            "--tensor-model-parallel-size",
            "2",
            "--sequence-parallel",
            "--transformer-impl",
            "transformer_engine",
        ]
    )
    cfg = megatron_config_from(ns)
    assert cfg == MegatronConfig(
        tensor_model_parallel_size=2, sequence_parallel=True, transformer_impl="transformer_engine"
    )
    assert cfg.data_parallel_size(8) == 4
    assert megatron_config_from({}) == MegatronConfig()


@pytest.mark.parametrize(
    ("gpus", "cfg", "match"),
    [
        pytest.param(
            6,
            MegatronConfig(tensor_model_parallel_size=4),
            r"actor GPUs 6 .* 4 × .* 1 = 4",
            id="not-divisible",
        ),
        pytest.param(
            8,
            MegatronConfig(pipeline_model_parallel_size=2),
            "--pipeline-model-parallel-size 2",
            id="pp",
        ),
        pytest.param(
            8,
            MegatronConfig(sequence_parallel=True, transformer_impl="transformer_engine"),
            "--sequence-parallel needs --tensor-model-parallel-size > 1",
            id="sp-without-tp",
        ),
        pytest.param(
            8,
            MegatronConfig(tensor_model_parallel_size=2, sequence_parallel=True),
            "--sequence-parallel needs --transformer-impl transformer_engine",
            id="sp-with-torch-norms",
        ),
    ],
)
def test_parallel_sizes_are_checked(gpus, cfg, match):
    with pytest.raises(ParallelConfigError, match=match):
        check_parallel_sizes(gpus, cfg)


def test_missing_extra_is_named(monkeypatch):
    real_import = builtins.__import__

    def no_megatron(name, *a, **k):
        if name.startswith("megatron"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_megatron)
    with pytest.raises(MegatronNotInstalledError, match=r"genrm-rl-core\[megatron\]"):
        require_megatron()
    assert MEGATRON_EXTRA == "genrm-rl-core[megatron]"


def test_require_megatron_returns_the_version():
    pytest.importorskip(
        "megatron.core", reason="megatron-core (the [megatron] extra) not installed"
    )
    assert require_megatron().count(".") >= 1
