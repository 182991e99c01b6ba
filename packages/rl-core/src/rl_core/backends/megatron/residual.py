"""Residual additions that keep the residual stream in the master weights' precision.

Megatron's own bias-dropout-add casts the residual to the dtype of the branch it adds (written
for its fp16 / bf16 parameter mode, where both are half precision anyway). Under autocast over
fp32 master weights — how this backend and the torch backend both train — that rounds the
whole residual stream to bf16 at every layer, while transformers' models keep it in fp32 (an
fp32 residual plus a bf16 branch promotes to fp32). Measured on a 2-layer Qwen3 in bf16, that
one rounding was most of the per-token log-prob gap between the two backends; the rollout
engines' own numerics differ from both anyway, but the two trainers must agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def promoting_bias_dropout_add(
    training: bool, fused: bool = False
) -> Callable[[tuple[torch.Tensor, torch.Tensor | None], torch.Tensor, float], torch.Tensor]:
    """Drop-in for Megatron's ``get_bias_dropout_add`` (the layer spec's ``*_bda``): the sum
    takes the wider of the two dtypes, as a plain ``residual + x`` does."""

    def bias_dropout_add(
        x_with_bias: tuple[torch.Tensor, torch.Tensor | None], residual: torch.Tensor, prob: float
    ) -> torch.Tensor:
        x, bias = x_with_bias
        if bias is not None:
            x = x + bias
        return residual + F.dropout(x, p=prob, training=training)

    return bias_dropout_add
