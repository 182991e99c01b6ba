"""The training-backend interface: the few things the GRPO driver needs from a trainer.

Kept small on purpose so a Megatron-core backend (GPU) can sit beside the PyTorch + transformers
one (CPU and small GPUs) without the driver knowing which it talks to: per-token log-probs of
sampled responses (policy and reference), one optimizer step on a global batch, the weights for
the rollout engines, memory offload / onload for colocated phases, and checkpoints.

The log-probs and the optimizer step are written once, here, as template methods of
:class:`TrainingBackend`, so both backends check, normalise and report alike; a backend supplies
only what differs: its forward, how it cuts micro-batches and how its optimizer steps.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch.utils.checkpoint import checkpoint

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

#: One chunk's log-probs and entropies: ``(hidden, weight, targets, *args)``.
ChunkLogprobs = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def chunked_logprobs(
    chunk: ChunkLogprobs,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *args: Any,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropies of ``targets`` ``[N]`` given ``hidden`` ``[N, H]``: ``chunk`` on
    ``chunk_size`` rows at a time, under activation checkpointing when grad is on.

    Full-vocabulary logits of every response position at once would dwarf the model, so each
    backend projects a chunk at a time and the backward recomputes it; they differ only in
    ``chunk`` (the whole vocabulary, or a tensor-parallel slice of it).
    """
    outs, ents = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, ent = checkpoint(chunk, h, weight, t, *args, use_reentrant=False)
        else:
            lp, ent = chunk(h, weight, t, *args)
        outs.append(lp)
        ents.append(ent)
    if not outs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(outs), torch.cat(ents)


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
    """A policy being trained (plus, when the KL loss is on, its frozen reference).

    :meth:`logprobs` and :meth:`train_step` are templates: a backend implements the forward of a
    micro-batch (:meth:`_response_logprobs`), how it cuts micro-batches (:meth:`_micro_batches`),
    which steps it refuses (:meth:`_check_train_step`) and how its optimizer takes the step
    (:meth:`_set_lr`, :meth:`_zero_grad`, :meth:`_sum_gradients`, :meth:`_clip_gradients`,
    :meth:`_optimizer_step`).
    """

    #: Optimizer steps taken so far.
    step: int
    cfg: BackendConfig
    #: The policy, and its frozen reference (None when none was loaded).
    model: Any
    ref_model: Any
    #: True between :meth:`offload` and :meth:`onload`: no compute until then.
    offloaded: bool

    # --- log-probs -------------------------------------------------------------------------------

    def logprobs(self, items: list[TrainItem], *, reference: bool = False) -> list[torch.Tensor]:
        """Per-response-token log-probs of each item (no grad), from the policy or the reference."""
        model = self.ref_model if reference else self.model
        if model is None:
            raise RuntimeError("no reference model loaded (the KL loss is off or its coef is 0)")
        self._check_loaded()
        model.eval()
        return collect_logprobs(
            lambda batch: self._forward(model, batch), items, self._micro_batches(items)
        )

    def _forward(
        self, model: Any, items: list[TrainItem]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-item response log-probs and entropies of one micro-batch."""
        logp, ent = self._response_logprobs(model, items)
        sizes = [it.response_len for it in items]
        return list(torch.split(logp, sizes)), list(torch.split(ent, sizes))

    @abstractmethod
    def _response_logprobs(
        self, model: Any, items: list[TrainItem]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs and entropies of every response token of ``items``, one flat tensor each
        (the items' responses in order)."""

    @abstractmethod
    def _micro_batches(self, items: list[TrainItem]) -> list[list[int]]:
        """``items``' indices cut into the micro-batches this backend's forward fits."""

    def _check_loaded(self) -> None:
        if self.offloaded:
            raise RuntimeError("training backend is offloaded; call onload() first")

    # --- training --------------------------------------------------------------------------------

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

        Metrics are this rank's share (sums over its tokens divided by ``total_tokens``): the
        trainer group sums them over data-parallel ranks.
        """
        self._check_loaded()
        self._check_train_step(total_tokens)
        local_tokens = float(sum(it.response_len for it in items if it.in_loss))
        # the token-mean is over the *global* batch: a data-parallel rank passes its total
        total_tokens = local_tokens if total_tokens is None else float(total_tokens)
        lr = lr_at(self.cfg, self.step)
        self._set_lr(lr)
        self.model.train()
        self._zero_grad()
        sums, n_micro = backward_micro_batches(
            lambda batch: self._forward(self.model, batch),
            items,
            self._micro_batches(items) if local_tokens > 0 else [],
            self.cfg.loss,
            total_tokens=total_tokens,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
        )
        grad_norm = 0.0
        self._sum_gradients()
        if total_tokens > 0:  # the same on every rank: all join the gradient reduction
            grad_norm = self._clip_gradients()
            if not math.isfinite(grad_norm):
                self._zero_grad()
                raise FloatingPointError(f"non-finite gradient norm at step {self.step}")
            self._optimizer_step()
        self._zero_grad()
        self.step += 1
        self.model.eval()
        return {
            **sums,
            "grad_norm": grad_norm,
            "lr": lr,
            "train_tokens": local_tokens,
            "micro_batches": float(n_micro),
        }

    @abstractmethod
    def _check_train_step(self, total_tokens: float | None) -> None:
        """Refuse a step this backend cannot take (``total_tokens`` as the caller passed it),
        before the step touches anything."""

    @abstractmethod
    def _set_lr(self, lr: float) -> None:
        """Set the step's learning rate (``lr_at``, the schedule of every backend)."""

    @abstractmethod
    def _zero_grad(self) -> None:
        """Drop the gradients: before the backward, after the step, and on a failed one."""

    @abstractmethod
    def _sum_gradients(self) -> None:
        """Sum the gradients over data parallelism where the optimizer does not: on every step,
        before the clip, a rank without any in-loss token joining with zeros."""

    @abstractmethod
    def _clip_gradients(self) -> float:
        """Clip the gradients to ``cfg.clip_grad`` by their global norm; returns the norm before
        clipping (the step is refused when it is not finite)."""

    @abstractmethod
    def _optimizer_step(self) -> None:
        """Apply the clipped gradients."""

    # --- weights, memory, checkpoints -----------------------------------------------------------

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
