"""The GRPO policy loss: PPO clip (asymmetric), KL to a reference, TIS, token-level aggregation.

All functions take per-token tensors of one shape (``[tokens]`` or ``[batch, tokens]``) and a
``mask`` of the tokens that count (response tokens of samples that are in the loss). The loss is
aggregated per token over the whole global batch: ``sum(loss * mask) / total_tokens``, where the
caller passes ``total_tokens`` of the global batch so that micro-batches accumulate to exactly the
full-batch mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

KLType = Literal["low_var_kl", "k1", "k2"]


#: Log-ratios are clamped to ±this before ``exp`` (as verl does): one extreme token (a log-prob
#: gap of 100 nats) would otherwise overflow to inf and turn the whole gradient into NaN.
LOG_RATIO_CLAMP = 20.0


def clamp_log_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_ratio, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate ``max(-A r, -A clip(r, 1-eps, 1+eps_high))``.

    Returns the per-token loss and a float mask of the tokens where clipping was active.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(clamp_log_ratio(logprobs - old_logprobs))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLType) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, from sampled tokens.

    ``k1 = log(p/q)``; ``k2 = 0.5 * log(p/q)^2``; ``low_var_kl`` (Schulman's k3) ``=
    q/p - log(q/p) - 1``, with ``q`` the reference, clamped to [-10, 10] for stability.
    """
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "low_var_kl":
        neg = -clamp_log_ratio(log_ratio)
        return torch.clamp(torch.exp(neg) - neg - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"--kl-loss-type must be one of low_var_kl, k1, k2; got {kind!r}")


def tis_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    *,
    clip: float,
    clip_low: float = 0.0,
) -> torch.Tensor:
    """Truncated importance-sampling weights ``clamp(exp(old - rollout), clip_low, clip)``.

    The rollout engine sampled with slightly different numerics (or older weights) than the
    trainer's ``old_logprobs``; this reweights the policy gradient toward the trainer's view and
    truncates the weight so one rare token cannot dominate. No gradient flows through it.
    """
    weights = torch.exp(clamp_log_ratio(old_logprobs - rollout_logprobs))
    return torch.clamp(weights, min=clip_low, max=clip).detach()


@dataclass(frozen=True)
class LossConfig:
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: KLType = "low_var_kl"
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0


@dataclass
class LossParts:
    """The loss of one micro-batch and the token *sums* of its metrics (divide by tokens)."""

    loss: torch.Tensor
    pg_loss_sum: float
    kl_sum: float
    clipfrac_sum: float
    tis_sum: float
    tokens: float


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    total_tokens: float,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> LossParts:
    """Token-level GRPO loss of one micro-batch, normalised by the global batch's token count.

    Args:
        logprobs: current policy log-probs of the sampled tokens (with grad).
        old_logprobs: log-probs before this step's update (no grad).
        advantages: the sample's advantage broadcast to its tokens.
        mask: 1 for tokens in the loss.
        total_tokens: masked tokens in the whole global batch.
        ref_logprobs: the reference model's log-probs (required when the KL term is on).
        rollout_logprobs: the rollout engine's log-probs (required with TIS).
    """
    if total_tokens <= 0:
        raise ValueError("total_tokens must be positive (no token in the loss)")
    mask = mask.to(logprobs.dtype)
    pg, clipped = ppo_clip_loss(
        logprobs, old_logprobs, advantages, eps_clip=cfg.eps_clip, eps_clip_high=cfg.eps_clip_high
    )
    tis_sum = 0.0
    if cfg.use_tis:
        if rollout_logprobs is None:
            raise ValueError("--use-tis needs the rollout engine's log-probs")
        w = tis_weights(
            old_logprobs, rollout_logprobs, clip=cfg.tis_clip, clip_low=cfg.tis_clip_low
        )
        pg = pg * w
        tis_sum = float((w * mask).sum())
    per_token = pg
    kl_sum = 0.0
    if cfg.use_kl_loss and cfg.kl_loss_coef != 0.0:
        if ref_logprobs is None:
            raise ValueError("the KL loss needs reference log-probs (--use-kl-loss)")
        kl = kl_penalty(logprobs, ref_logprobs, cfg.kl_loss_type)
        per_token = per_token + cfg.kl_loss_coef * kl
        kl_sum = float((kl.detach() * mask).sum())
    elif ref_logprobs is not None:
        kl_sum = float((kl_penalty(logprobs.detach(), ref_logprobs, cfg.kl_loss_type) * mask).sum())
    loss = (per_token * mask).sum() / total_tokens
    return LossParts(
        loss=loss,
        pg_loss_sum=float((pg.detach() * mask).sum()),
        kl_sum=kl_sum,
        clipfrac_sum=float((clipped * mask).sum()),
        tis_sum=tis_sum,
        tokens=float(mask.sum()),
    )
