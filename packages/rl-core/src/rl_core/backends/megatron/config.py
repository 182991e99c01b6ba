"""An HF model config → the arguments of Megatron's ``TransformerConfig`` and ``GPTModel``.

Only dense decoder families whose layers Megatron's GPT layer spec reproduces exactly are
accepted: Qwen3 (qk-norm, GQA, RoPE θ, tied or untied embeddings), Qwen2 (bias on q/k/v only)
and Llama-family dense models (Llama 2/3, including Llama 3's RoPE scaling). Anything else is
refused with its architecture named, because a silently different layer would train a
different model than the one the rollout engines serve.

:func:`model_args_from_hf` is pure (no megatron import), so it is checked on any machine;
:func:`build_transformer_config` and :func:`build_gpt_model` import megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: HF ``architectures`` entry → family. Qwen2 is Llama-shaped plus q/k/v biases.
SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


class UnsupportedModelError(ValueError):
    """An HF model the Megatron backend cannot reproduce; names the architecture or the key."""


@dataclass(frozen=True)
class MegatronModelArgs:
    """Everything needed to build the Megatron model and to map its weights to and from HF."""

    architecture: str
    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    norm_epsilon: float
    rope_theta: float
    tie_word_embeddings: bool
    qk_layernorm: bool
    qkv_bias: bool
    #: Llama 3 RoPE scaling factor (None: plain RoPE).
    rope_scaling_factor: float | None = None

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def _rope(cfg: Any) -> tuple[float, dict[str, Any]]:
    """θ and the scaling dict; transformers 5 keeps both in ``rope_parameters``, 4 at top level."""
    params = dict(_get(cfg, "rope_parameters") or {})
    scaling = dict(_get(cfg, "rope_scaling") or {})
    theta = params.get("rope_theta", _get(cfg, "rope_theta", 10000.0))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    merged = {**scaling, **params, "rope_type": rope_type or "default"}
    return float(theta), merged


# Megatron's Llama 3 scaling hard-codes these; any other value would be a different RoPE.
_LLAMA3_FIXED = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def model_args_from_hf(cfg: Any) -> MegatronModelArgs:
    """Map an HF config (a ``PretrainedConfig`` or its ``config.json`` dict) to Megatron args."""
    archs = list(_get(cfg, "architectures") or [])
    # A config built in code (not loaded from a checkpoint) has no architectures: its model_type
    # names the family.
    by_type = {v: k for k, v in SUPPORTED_ARCHITECTURES.items()}
    model_type = _get(cfg, "model_type")
    arch = archs[0] if archs else by_type.get(model_type, f"model_type={model_type!r}")
    family = SUPPORTED_ARCHITECTURES.get(arch)
    if family is None:
        raise UnsupportedModelError(
            f"--train-backend megatron: architecture {arch} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (dense Qwen3 / Qwen2 / Llama). Use "
            "--train-backend torch for other models."
        )

    def refuse(key: str, value: Any, rule: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{arch}: {key}={value!r} is not supported ({rule})")

    hidden = int(_get(cfg, "hidden_size"))
    heads = int(_get(cfg, "num_attention_heads"))
    groups = int(_get(cfg, "num_key_value_heads") or heads)
    head_dim = int(_get(cfg, "head_dim") or hidden // heads)
    if heads % groups:
        raise refuse("num_key_value_heads", groups, f"must divide num_attention_heads {heads}")
    act = _get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise refuse("hidden_act", act, "only SwiGLU (silu) MLPs")
    if _get(cfg, "mlp_bias", False):
        raise refuse("mlp_bias", True, "MLP biases are not mapped")
    attention_bias = bool(_get(cfg, "attention_bias", False))
    if family != "qwen2" and attention_bias:
        raise refuse("attention_bias", True, "q/k/v/o biases are not mapped")
    if family == "qwen2" and _get(cfg, "use_sliding_window", False):
        raise refuse("use_sliding_window", True, "sliding-window attention is not mapped")
    if family == "llama" and _get(cfg, "sliding_window"):
        raise refuse("sliding_window", _get(cfg, "sliding_window"), "no sliding window")
    theta, rope = _rope(cfg)
    factor: float | None = None
    if rope["rope_type"] == "llama3":
        for key, want in _LLAMA3_FIXED.items():
            if key in rope and float(rope[key]) != want:
                raise refuse(
                    f"rope_scaling.{key}", rope[key], f"Megatron's Llama 3 RoPE uses {want}"
                )
        factor = float(rope.get("factor", 8.0))
    elif rope["rope_type"] != "default":
        raise refuse("rope_scaling.rope_type", rope["rope_type"], "only default and llama3 RoPE")
    return MegatronModelArgs(
        architecture=arch,
        family=family,
        num_layers=int(_get(cfg, "num_hidden_layers")),
        hidden_size=hidden,
        ffn_hidden_size=int(_get(cfg, "intermediate_size")),
        num_attention_heads=heads,
        num_query_groups=groups,
        head_dim=head_dim,
        vocab_size=int(_get(cfg, "vocab_size")),
        max_position_embeddings=int(_get(cfg, "max_position_embeddings", 4096)),
        norm_epsilon=float(_get(cfg, "rms_norm_eps", 1e-6)),
        rope_theta=theta,
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", False)),
        qk_layernorm=family == "qwen3",
        qkv_bias=family == "qwen2",
        rope_scaling_factor=factor,
    )


def check_tensor_parallel(args: MegatronModelArgs, tp: int) -> None:
    """The shapes TP must divide (heads, query groups, MLP width, vocabulary)."""
    for name, value in (
        ("num_attention_heads", args.num_attention_heads),
        ("num_key_value_heads", args.num_query_groups),
        ("intermediate_size", args.ffn_hidden_size),
        ("vocab_size", args.vocab_size),
    ):
        if value % tp:
            raise UnsupportedModelError(
                f"--tensor-model-parallel-size {tp} must divide {args.architecture}'s "
                f"{name} {value}"
            )


def transformer_config_kwargs(
    args: MegatronModelArgs,
    *,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    sequence_parallel: bool = False,
    use_cpu_initialization: bool = False,
) -> dict[str, Any]:
    """``TransformerConfig(**kwargs)`` for the model; fp32 parameters (bf16 is autocast).

    Fusions that need Apex / Transformer Engine kernels are off, and dropout is 0 (an RL policy
    is trained without it, and the log-probs must equal the rollout engine's).
    """
    import torch.nn.functional as F

    return {
        "num_layers": args.num_layers,
        "hidden_size": args.hidden_size,
        "ffn_hidden_size": args.ffn_hidden_size,
        "num_attention_heads": args.num_attention_heads,
        "num_query_groups": args.num_query_groups,
        "kv_channels": args.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": args.norm_epsilon,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": args.qkv_bias,
        "qk_layernorm": args.qk_layernorm,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "tensor_model_parallel_size": tensor_model_parallel_size,
        "pipeline_model_parallel_size": pipeline_model_parallel_size,
        "sequence_parallel": sequence_parallel,
        "use_cpu_initialization": use_cpu_initialization,
        "perform_initialization": False,  # the weights come from the HF checkpoint
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "persist_layer_norm": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        # DDP sums gradients over data parallelism instead of averaging: the GRPO loss is
        # already divided by the whole global batch's tokens
        "calculate_per_token_loss": True,
    }


def gpt_model_kwargs(args: MegatronModelArgs) -> dict[str, Any]:
    """``GPTModel(config, spec, **kwargs)``: vocabulary, RoPE and embedding tying."""
    return {
        "vocab_size": args.vocab_size,
        "max_sequence_length": args.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": args.rope_theta,
        "rope_scaling": args.rope_scaling_factor is not None,
        "rope_scaling_factor": args.rope_scaling_factor or 8.0,
        "share_embeddings_and_output_weights": args.tie_word_embeddings,
        "parallel_output": True,
    }
