"""The training-backend interface: the few things the GRPO driver needs from a trainer.

Kept small on purpose so a Megatron-core backend (GPU) can sit beside the PyTorch + transformers
one (CPU and small GPUs) without the driver knowing which it talks to: per-token log-probs of
sampled responses (policy and reference), one optimizer step on a global batch, the weights for
the rollout engines, memory offload / onload for colocated phases, and checkpoints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from rl_core.grpo.loss import LossConfig, grpo_loss

LrDecayStyle = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class TrainItem:
    """One sample as the trainer sees it.

    ``tokens`` is prompt + response; the response starts at ``response_start``. ``advantage``
    applies to every response token; ``in_loss`` False (a judge failure) masks the whole sample.
    """

    tokens: list[int]
    response_start: int
    advantage: float
    in_loss: bool
    rollout_logprobs: list[float] | None = None

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.response_start


@dataclass(frozen=True)
class BackendConfig:
    """Optimizer and batching settings shared by all backends (the train flags map onto it)."""

    lr: float = 1e-6
    min_lr: float = 0.0
    lr_decay_style: LrDecayStyle = "constant"
    lr_warmup_iters: int = 0
    lr_decay_iters: int | None = None
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    max_tokens_per_micro_batch: int = 4096
    logprob_chunk_size: int = 256
    bf16: bool | None = False  # None = auto: bf16 only where the device has it natively
    temperature: float = 1.0
    seed: int = 1234
    loss: LossConfig = field(default_factory=LossConfig)


def lr_at(cfg: BackendConfig, step: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then the decay style."""
    if cfg.lr_warmup_iters > 0 and step < cfg.lr_warmup_iters:
        return cfg.lr * (step + 1) / cfg.lr_warmup_iters
    if cfg.lr_decay_style == "constant":
        return cfg.lr
    total = cfg.lr_decay_iters
    if total is None or total <= cfg.lr_warmup_iters:
        raise ValueError(f"--lr-decay-style {cfg.lr_decay_style} needs --lr-decay-iters > warmup")
    frac = min(1.0, (step - cfg.lr_warmup_iters) / (total - cfg.lr_warmup_iters))
    if cfg.lr_decay_style == "linear":
        return cfg.lr - (cfg.lr - cfg.min_lr) * frac
    import math

    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def no_weight_decay(name: str, param: torch.Tensor) -> bool:
    """Norm weights and biases are not decayed: shrinking a norm's gain or a bias toward 0 is
    not regularisation, it changes the function (the usual rule, and Megatron's): 1-D tensors
    and anything named ``*.bias``."""
    return param.ndim < 2 or name.endswith(".bias")


def param_groups(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float
) -> list[dict[str, Any]]:
    """Optimizer parameter groups: decayed weights, then norms and biases with no decay.

    Trainable parameters only; an empty group is left out (torch refuses none).
    """
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in named_parameters:
        if p.requires_grad:
            (no_decay if no_weight_decay(name, p) else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


Forward = Callable[[list[TrainItem]], tuple[list[torch.Tensor], list[torch.Tensor]]]


def backward_micro_batches(
    forward: Forward,
    items: list[TrainItem],
    micro_batches: list[list[int]],
    loss_cfg: LossConfig,
    *,
    total_tokens: float,
    old_logprobs: list[torch.Tensor] | None,
    ref_logprobs: list[torch.Tensor] | None,
) -> tuple[dict[str, float], int]:
    """The GRPO loss of every micro-batch that has in-loss tokens, back-propagated.

    Shared by the backends, which differ only in ``forward`` (a micro-batch's per-token
    log-probs and entropies) and in how they cut ``micro_batches``. The loss is a token mean over
    ``total_tokens`` (the global batch's), so gradients accumulate to the global batch's. Returns
    metric sums (each already divided by ``total_tokens``) and the micro-batches run.
    """
    sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clipfrac": 0.0, "tis": 0.0, "entropy": 0.0}
    n_micro = 0
    for mb in micro_batches:
        batch = [items[i] for i in mb]
        if not any(it.in_loss for it in batch):
            continue
        n_micro += 1
        logps, ents = forward(batch)
        logp = torch.cat(logps)
        dev = logp.device
        adv = torch.cat([torch.full((it.response_len,), it.advantage) for it in batch]).to(dev)
        mask = torch.cat([torch.full((it.response_len,), float(it.in_loss)) for it in batch])
        mask = mask.to(dev)
        if old_logprobs is None:  # on-policy single step: old = current, no extra pass
            old = logp.detach()
        else:
            old = torch.cat([old_logprobs[i] for i in mb]).to(dev)
        ref = torch.cat([ref_logprobs[i] for i in mb]).to(dev) if ref_logprobs is not None else None
        rollout = None
        if loss_cfg.use_tis:
            rollout = torch.cat([torch.tensor(it.rollout_logprobs or []) for it in batch]).to(dev)
        parts = grpo_loss(
            logp,
            old,
            adv,
            mask,
            loss_cfg,
            total_tokens=total_tokens,
            ref_logprobs=ref,
            rollout_logprobs=rollout,
        )
        torch.autograd.backward(parts.loss)
        sums["loss"] += float(parts.loss.detach())
        sums["pg_loss"] += parts.pg_loss_sum / total_tokens
        sums["kl"] += parts.kl_sum / total_tokens
        sums["clipfrac"] += parts.clipfrac_sum / total_tokens
        sums["tis"] += parts.tis_sum / total_tokens
        sums["entropy"] += float((torch.cat(ents) * mask).sum()) / total_tokens
    return sums, n_micro


def collect_logprobs(
    forward: Forward, items: list[TrainItem], micro_batches: list[list[int]]
) -> list[torch.Tensor]:
    """Per-item response log-probs (no grad, on the host), a micro-batch at a time."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(items)
    with torch.no_grad():
        for mb in micro_batches:
            lps, _ = forward([items[i] for i in mb])
            for i, lp in zip(mb, lps, strict=True):
                out[i] = lp.float().cpu()
    return out


class TrainingBackend(ABC):
    """A policy being trained (plus, when the KL loss is on, its frozen reference)."""

    #: Optimizer steps taken so far.
    step: int

    @abstractmethod
    def logprobs(self, items: list[TrainItem], *, reference: bool = False) -> list[torch.Tensor]:
        """Per-response-token log-probs of each item (no grad), from the policy or the reference."""

    @abstractmethod
    def train_step(
        self,
        items: list[TrainItem],
        *,
        old_logprobs: list[torch.Tensor] | None,
        ref_logprobs: list[torch.Tensor] | None = None,
        total_tokens: float | None = None,
    ) -> dict[str, float]:
        """One optimizer step on a global batch; returns metrics (loss, kl, clipfrac, ...).

        ``total_tokens`` is the in-loss token count of the whole global batch when ``items`` is
        one data-parallel rank's share of it (default: the count of ``items``); the loss is a
        token mean over the global batch, and gradients are summed over the ranks.

        ``old_logprobs`` None means the batch is on-policy for this very step (one optimizer
        step per rollout): the old log-probs are the current ones, detached, which saves a
        forward pass over the batch.
        """

    @abstractmethod
    def export_weights(self) -> dict[str, torch.Tensor]:
        """The policy's weights, as the rollout engines load them."""

    @abstractmethod
    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's weights under the engines' (HF) names, in a fixed order, where they live
        (no host copy): what a weight sync packs into buckets on the device."""

    @abstractmethod
    def offload(self) -> None:
        """Release accelerator memory (weights, grads, optimizer state) for another phase."""

    @abstractmethod
    def onload(self) -> None:
        """Take the accelerator memory back before training."""

    @abstractmethod
    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """Write a checkpoint (model, optimizer, step, and the caller's ``extra`` state)."""

    @abstractmethod
    def load(self, path: Path) -> dict[str, Any]:
        """Restore a checkpoint written by :meth:`save`; returns its ``extra`` state."""
