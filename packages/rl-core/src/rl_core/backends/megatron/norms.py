"""The query / key RMSNorm of the local layer spec, with transformers' rounding.

Qwen3's q / k norms act on the outputs of a bf16 matmul under autocast. transformers normalises
in fp32, rounds back to the input's dtype, and multiplies by the fp32 gain, so the queries and
keys enter RoPE in fp32; torch's fused ``rms_norm`` (Megatron's local norm) returns bf16 and
RoPE then runs in bf16. In a 2-layer Qwen3 under bf16 that was where the two backends' hidden
states first parted (1.9e-3 relative after the first q norm). The norm is small (one head's
width per row), so matching transformers here costs little; the layer norms of the residual
stream see fp32 inputs and agree already.
"""

from __future__ import annotations

from typing import Any

import torch


class HFRMSNorm(torch.nn.Module):
    """``Qwen3RMSNorm`` / ``LlamaRMSNorm``'s arithmetic behind Megatron's norm constructor."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)
