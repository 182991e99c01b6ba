"""Weights between HF (transformers) names and Megatron GPTModel names, sharded for TP.

Pure functions over ``{name: tensor}`` dicts: no process group, no megatron import. The backend
calls :func:`hf_to_megatron` when it loads an HF checkpoint (each rank keeps its own shard) and
:func:`megatron_to_hf` on the gathered shards for weight sync to the rollout engines and for
checkpoints that load in transformers. The round trip is exact (only copies and reshapes).

Megatron's layouts that differ from HF's:

* ``linear_qkv`` holds q, k and v **interleaved per query group**: for each of the ``g`` KV
  heads, its ``heads/g`` query heads, then its key head, then its value head. A TP rank holds
  ``g / tp`` whole groups, so GQA never splits a group.
* ``linear_fc1`` is SwiGLU's gate and up projections fused; a TP rank's shard is
  ``[gate_shard; up_shard]`` (not a slice of ``[gate; up]``).
* Column-parallel weights (qkv, fc1, word embeddings, output layer) split dim 0; row-parallel
  ones (``linear_proj``, ``linear_fc2``) split dim 1; norms are replicated.

With Transformer Engine's layer spec the two pre-norms are fused into the next linear layer
(``linear_qkv.layer_norm_weight``, ``linear_fc1.layer_norm_weight``): ``fused_norms=True``.
"""

from __future__ import annotations

import torch

from rl_core.backends.megatron.config import MegatronModelArgs

Tensors = dict[str, torch.Tensor]

_HF_LAYER = "model.layers.{i}."
_MG_LAYER = "decoder.layers.{i}."


def _norm_names(fused_norms: bool) -> tuple[str, str]:
    if fused_norms:
        return "self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"
    return "input_layernorm.weight", "pre_mlp_layernorm.weight"


def _replicated_pairs(args: MegatronModelArgs, fused_norms: bool) -> list[tuple[str, str]]:
    """(HF name, Megatron name) of the weights every TP rank holds whole."""
    pre_attn, pre_mlp = _norm_names(fused_norms)
    pairs = [("model.norm.weight", "decoder.final_layernorm.weight")]
    for i in range(args.num_layers):
        hf, mg = _HF_LAYER.format(i=i), _MG_LAYER.format(i=i)
        pairs += [
            (hf + "input_layernorm.weight", mg + pre_attn),
            (hf + "post_attention_layernorm.weight", mg + pre_mlp),
        ]
        if args.qk_layernorm:
            pairs += [
                (hf + "self_attn.q_norm.weight", mg + "self_attention.q_layernorm.weight"),
                (hf + "self_attn.k_norm.weight", mg + "self_attention.k_layernorm.weight"),
            ]
    return pairs


def _split_pairs(args: MegatronModelArgs) -> list[tuple[str, str, int]]:
    """(HF name, Megatron name, split dim) of the plain column- / row-parallel weights."""
    pairs = [("model.embed_tokens.weight", "embedding.word_embeddings.weight", 0)]
    if not args.tie_word_embeddings:
        pairs.append(("lm_head.weight", "output_layer.weight", 0))
    for i in range(args.num_layers):
        hf, mg = _HF_LAYER.format(i=i), _MG_LAYER.format(i=i)
        pairs += [
            (hf + "self_attn.o_proj.weight", mg + "self_attention.linear_proj.weight", 1),
            (hf + "mlp.down_proj.weight", mg + "mlp.linear_fc2.weight", 1),
        ]
    return pairs


def _take(hf: Tensors, name: str) -> torch.Tensor:
    try:
        return hf[name]
    except KeyError:
        raise KeyError(f"HF checkpoint has no weight {name!r}") from None


def _qkv_groups(
    args: MegatronModelArgs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """q/k/v (weights ``[out, hidden]`` or biases ``[out]``) → ``[groups, (hpg + 2) * d, ...]``."""
    g, d = args.num_query_groups, args.head_dim
    rest = q.shape[1:]
    return torch.cat(
        [
            q.reshape(g, args.heads_per_group * d, *rest),
            k.reshape(g, d, *rest),
            v.reshape(g, d, *rest),
        ],
        dim=1,
    )


def hf_to_megatron(
    hf: Tensors, args: MegatronModelArgs, tp_size: int = 1, *, fused_norms: bool = False
) -> list[Tensors]:
    """One Megatron state dict per TP rank (``result[r]`` is rank r's shard)."""
    shards: list[Tensors] = [{} for _ in range(tp_size)]
    for hf_name, mg_name in _replicated_pairs(args, fused_norms):
        w = _take(hf, hf_name)
        for shard in shards:
            shard[mg_name] = w.clone()
    for hf_name, mg_name, dim in _split_pairs(args):
        for shard, part in zip(shards, torch.chunk(_take(hf, hf_name), tp_size, dim), strict=True):
            shard[mg_name] = part.clone()
    for i in range(args.num_layers):
        hf_l, mg_l = _HF_LAYER.format(i=i), _MG_LAYER.format(i=i)
        kinds = ["weight", "bias"] if args.qkv_bias else ["weight"]
        for kind in kinds:
            q, k, v = (_take(hf, f"{hf_l}self_attn.{p}_proj.{kind}") for p in "qkv")
            grouped = _qkv_groups(args, q, k, v)
            for shard, part in zip(shards, torch.chunk(grouped, tp_size, 0), strict=True):
                shard[f"{mg_l}self_attention.linear_qkv.{kind}"] = part.reshape(
                    -1, *q.shape[1:]
                ).clone()
        gate = torch.chunk(_take(hf, hf_l + "mlp.gate_proj.weight"), tp_size, 0)
        up = torch.chunk(_take(hf, hf_l + "mlp.up_proj.weight"), tp_size, 0)
        for shard, g_part, u_part in zip(shards, gate, up, strict=True):
            shard[mg_l + "mlp.linear_fc1.weight"] = torch.cat([g_part, u_part], 0)
    return shards


def _joined(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat`` of TP shards; one shard is returned as it is (a view, no copy): a weight
    sync reads the policy through here on every sync."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def megatron_to_hf(
    shards: list[Tensors], args: MegatronModelArgs, *, fused_norms: bool = False
) -> Tensors:
    """The HF state dict from every TP rank's Megatron state dict (``shards[r]`` = rank r).

    A tied model gets no ``lm_head.weight`` (transformers ties it to the embedding on load,
    and the rollout engines name a tied weight once).
    """
    first = shards[0]
    hf: Tensors = {}
    for hf_name, mg_name in _replicated_pairs(args, fused_norms):
        hf[hf_name] = first[mg_name]
    for hf_name, mg_name, dim in _split_pairs(args):
        hf[hf_name] = _joined([s[mg_name] for s in shards], dim)
    g, d, hpg = args.num_query_groups, args.head_dim, args.heads_per_group
    for i in range(args.num_layers):
        hf_l, mg_l = _HF_LAYER.format(i=i), _MG_LAYER.format(i=i)
        kinds = ["weight", "bias"] if args.qkv_bias else ["weight"]
        for kind in kinds:
            parts = [s[f"{mg_l}self_attention.linear_qkv.{kind}"] for s in shards]
            rest = parts[0].shape[1:]
            grouped = _joined([p.reshape(-1, (hpg + 2) * d, *rest) for p in parts], 0)
            q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
            hf[f"{hf_l}self_attn.q_proj.{kind}"] = q.reshape(g * hpg * d, *rest)
            hf[f"{hf_l}self_attn.k_proj.{kind}"] = k.reshape(g * d, *rest)
            hf[f"{hf_l}self_attn.v_proj.{kind}"] = v.reshape(g * d, *rest)
        halves = [torch.chunk(s[mg_l + "mlp.linear_fc1.weight"], 2, 0) for s in shards]
        hf[hf_l + "mlp.gate_proj.weight"] = _joined([h[0] for h in halves], 0)
        hf[hf_l + "mlp.up_proj.weight"] = _joined([h[1] for h in halves], 0)
    return hf


def megatron_param_kinds(name: str) -> str:
    """How a Megatron parameter is split over TP: ``column`` (dim 0), ``row`` (dim 1) or
    ``replicated`` — what the backend needs to all-gather shards before :func:`megatron_to_hf`."""
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "row"
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight")) or name in (
        "embedding.word_embeddings.weight",
        "output_layer.weight",
    ):
        return "column"
    return "replicated"
