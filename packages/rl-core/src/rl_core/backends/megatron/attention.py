"""A core-attention module for Megatron's local layer spec, on torch's fused SDPA kernels.

Megatron's own local ``DotProductAttention`` materialises the ``[b·heads, s, s]`` score matrix
(and its fp32 softmax) in every layer and refuses packed sequences; without Transformer Engine
that is the only choice. This module takes its place in the spec (same constructor and forward
signature) and calls ``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal``,
which runs flash / memory-efficient kernels on a GPU and never stores the scores.

Packed sequences (THD, ``packed_seq_params.cu_seqlens_q``): on a GPU in half precision, one
call of torch's variable-length flash kernel (``torch.nn.attention.varlen``) over the whole pack;
elsewhere (CPU, fp32, a torch without it) one causal SDPA call per sequence of the pack. Either
way no token attends across a sequence boundary and there is no padding. Unpacked
``[s, b, heads, d]`` batches are right-padded by the caller; causal attention means a real token
never sees the padding after it, so no mask is needed.
"""

from __future__ import annotations

import inspect
import itertools
import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


def _find_varlen() -> tuple[Any, dict[str, Any], bool]:
    """torch's varlen flash attention (torch ≥ 2.9), how it is told "causal", and whether it
    takes grouped KV heads itself (its keyword arguments changed between releases)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, {}, False
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    return varlen_attn, causal, "enable_gqa" in params


_varlen_attn, _VARLEN_CAUSAL, _VARLEN_GQA = _find_varlen()


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

    def _equal_lengths(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Any
    ) -> torch.Tensor | None:
        """A pack of sequences that are all one length is a plain batch: one batched SDPA call
        (on a GPU, cuDNN's attention, faster than the varlen flash kernel), or None."""
        bounds = packed.cu_seqlens_q
        n = len(bounds) - 1
        if n < 1 or bounds.is_cuda or q.shape[0] % n:
            return None
        length = q.shape[0] // n
        if not torch.equal(bounds, torch.arange(0, q.shape[0] + 1, length, dtype=bounds.dtype)):
            return None
        q, k, v = (x.reshape(n, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        return self._sdpa(q, k, v).transpose(1, 2).reshape(n * length, -1, q.shape[-1])

    def _varlen(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packed: Any
    ) -> torch.Tensor | None:
        """The whole pack in one flash-attention call, or None where that kernel cannot run."""
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
        if (
            _varlen_attn is None
            or not q.is_cuda
            or dtype not in (torch.bfloat16, torch.float16)
            or (self.training and self.dropout > 0)
        ):
            return None
        q, k, v = (x.to(dtype) for x in (q, k, v))
        if k.shape[1] != q.shape[1] and not _VARLEN_GQA:
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        # the boundaries may live on the host (see the backend's ``_forward``): copied once per
        # pack, not once per layer
        cu = getattr(packed, "_cu_seqlens_device", None)
        if cu is None:
            cu = packed.cu_seqlens_q.to(q.device, torch.int32)
            packed._cu_seqlens_device = cu
        cu_k = (
            cu
            if packed.cu_seqlens_kv is packed.cu_seqlens_q
            else packed.cu_seqlens_kv.to(q.device, torch.int32)
        )
        kwargs: dict[str, Any] = {"scale": self.softmax_scale, **_VARLEN_CAUSAL}
        if _VARLEN_GQA and k.shape[1] != q.shape[1]:
            kwargs["enable_gqa"] = True
        return _varlen_attn(  # type: ignore[no-any-return]
            q, k, v, cu, cu_k, packed.max_seqlen_q, packed.max_seqlen_kv, **kwargs
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
            out = self._equal_lengths(query, key, value, packed_seq_params)
            if out is None:
                out = self._varlen(query, key, value, packed_seq_params)
            if out is not None:
                return out.reshape(out.shape[0], -1)
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
