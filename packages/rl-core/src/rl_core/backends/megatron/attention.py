"""A core-attention module for Megatron's local layer spec, on torch's fused SDPA kernels.

Megatron's own local ``DotProductAttention`` materialises the ``[b·heads, s, s]`` score matrix
(and its fp32 softmax) in every layer and refuses packed sequences; without Transformer Engine
that is the only choice. This module takes its place in the spec (same constructor and forward
signature) and calls ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal``,
which runs flash / memory-efficient kernels on a GPU and never stores the scores.

Packed sequences (THD, ``packed_seq_params.cu_seqlens_q``): every sequence of the pack is one
causal SDPA call on its own slice, so no token attends across a sequence boundary and there is no
padding. Unpacked ``[s, b, heads, d]`` batches are right-padded by the caller; causal attention
means a real token never sees the padding after it, so no mask is needed.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


class SDPACoreAttention(MegatronModule):  # type: ignore[misc]
    """Causal self-attention over this rank's heads (drop-in for ``DotProductAttention``)."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPACoreAttention does not support context parallelism")
        self.softmax_scale = softmax_scale or 1.0 / math.sqrt(config.kv_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # [b, heads, s, d]; GQA: the kernel repeats each KV head for its query heads.
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.softmax_scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention does not support an attention bias")
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            # [t, heads, d]; one causal call per sequence of the pack.
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            outs = []
            for start, end in itertools.pairwise(bounds):
                q, k, v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (query, key, value))
                outs.append(self._sdpa(q, k, v)[0].transpose(0, 1))
            out = torch.cat(outs, 0)
            return out.reshape(out.shape[0], -1)
        # [s, b, heads, d] → [b, heads, s, d] and back to [s, b, heads·d].
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out = self._sdpa(q, k, v).permute(2, 0, 1, 3)
        return out.reshape(out.shape[0], out.shape[1], -1)
