"""Token log-probs from the last hidden states, over a vocabulary that may be split over TP.

Full-vocabulary fp32 logits of a whole batch never exist: only response positions are projected,
``chunk_size`` rows at a time, each chunk under activation checkpointing (the backward
recomputes it), as in the torch backend. With tensor parallelism each rank holds a slice of the
output layer, so a chunk's log-softmax is reduced over the TP group (max, sum of exponentials,
the target's logit) — the same reduction as Megatron's ``vocab_parallel_cross_entropy``, with
the rollout temperature applied to the logits first.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from rl_core.backends.base import chunked_logprobs
from rl_core.backends.torch_hf import token_logprobs


class _AllReduce(torch.autograd.Function):
    """Sum over the TP group in forward; the gradient passes to every rank unchanged.

    (Each rank's partial sum depends only on its own vocabulary slice, so the gradient of the
    total with respect to the partial is 1.)
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def _chunk_vocab_parallel(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    vocab_start: int,
    group: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (hidden @ weight.t()).float() / temperature  # [n, V / tp]
    with torch.no_grad():
        gmax = logits.max(-1).values
        dist.all_reduce(gmax, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - gmax.unsqueeze(-1)  # the max is a constant: no gradient through it
    sum_exp = _AllReduce.apply(shifted.exp().sum(-1), group)  # type: ignore[no-untyped-call]
    local = targets - vocab_start
    mine = (local >= 0) & (local < weight.shape[0])
    picked = shifted.gather(-1, local.clamp(0, weight.shape[0] - 1).unsqueeze(-1)).squeeze(-1)
    target_logit = _AllReduce.apply(picked * mine, group)  # type: ignore[no-untyped-call]
    lse = torch.log(sum_exp)
    logp = target_logit - lse
    with torch.no_grad():
        probs = torch.exp(shifted - lse.unsqueeze(-1))
        p_logit = (probs * shifted).sum(-1)
        dist.all_reduce(p_logit, group=group)
        entropy = lse - p_logit
    return logp, entropy


def vocab_parallel_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    chunk_size: int,
    tp_group: Any = None,
    tp_rank: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of ``targets`` ``[N]`` given ``hidden`` ``[N, H]`` (full sequence
    on every TP rank) and this rank's rows of the output layer ``weight`` ``[V / tp, H]``."""
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return token_logprobs(
            hidden, weight, targets, temperature=temperature, chunk_size=chunk_size
        )
    vocab_start = tp_rank * weight.shape[0]
    return chunked_logprobs(
        _chunk_vocab_parallel,
        hidden,
        weight,
        targets,
        temperature,
        vocab_start,
        tp_group,
        chunk_size=chunk_size,
    )
