"""Batched sampling on the logits' own device: temperature, top-k, top-p and per-row seeds.

Every row of a batch has its own settings, and rollout needs, per sampled token, its log-prob
under the distribution it was drawn from *and* under the raw model. All of it is computed for
the whole batch in a handful of tensor operations, so decoding copies only the chosen tokens and
their two log-probs to the host, never a vocabulary-sized row.

Randomness is counter-based: the noise of row r at step s over token v is a hash of (the row's
seed, s, v). A row's sample therefore depends on its own seed and logits only — not on which
other rows share its batch, nor on how a batch was split — which is what makes a seeded request
reproducible, alone or in any batch. Sampling is the Gumbel-max trick: the arg-max of
``filtered log-probs + Gumbel noise`` is a draw from ``softmax(filtered log-probs)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from genrm_client.types import SamplingParams

__all__ = ["RowSampling", "sample"]

_MASK32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # odd, < 2**27: products of 32-bit values stay inside int64


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with full avalanche, on int64 tensors holding values < 2**32."""
    x = x ^ (x >> 16)
    x = (x * _MUL) & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MUL) & _MASK32
    return x ^ (x >> 16)


@dataclass
class RowSampling:
    """The sampling settings of a batch of rows, as device tensors."""

    temperature: torch.Tensor  # [rows] float32, 0 = greedy
    top_k: torch.Tensor  # [rows] int64, <= 0 = off
    top_p: torch.Tensor  # [rows] float32, 1 = off
    seed: torch.Tensor  # [rows] int64, 32-bit
    max_top_k: int
    any_top_p: bool
    all_greedy: bool

    @classmethod
    def of(
        cls, params: list[SamplingParams], seeds: list[int], device: torch.device
    ) -> RowSampling:
        temps = [float(p.temperature or 0.0) for p in params]
        ks = [int(p.top_k) if p.top_k is not None else -1 for p in params]
        ps = [float(p.top_p) if p.top_p is not None else 1.0 for p in params]
        sampled = [t > 0.0 for t in temps]
        return cls(
            temperature=torch.tensor(temps, dtype=torch.float32, device=device),
            top_k=torch.tensor(ks, dtype=torch.long, device=device),
            top_p=torch.tensor(ps, dtype=torch.float32, device=device),
            seed=torch.tensor([s & _MASK32 for s in seeds], dtype=torch.long, device=device),
            max_top_k=max((k for k, s in zip(ks, sampled, strict=True) if s), default=-1),
            any_top_p=any(p < 1.0 for p, s in zip(ps, sampled, strict=True) if s),
            all_greedy=not any(sampled),
        )

    def select(self, keep: torch.Tensor) -> RowSampling:
        return RowSampling(
            temperature=self.temperature.index_select(0, keep),
            top_k=self.top_k.index_select(0, keep),
            top_p=self.top_p.index_select(0, keep),
            seed=self.seed.index_select(0, keep),
            max_top_k=self.max_top_k,
            any_top_p=self.any_top_p,
            all_greedy=self.all_greedy,
        )


def _draw(filtered: torch.Tensor, seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """arg-max of ``filtered`` + Gumbel noise that is a function of (seed, step, token) only."""
    key = _mix32(seed ^ _mix32((step * 0x9E3779B1) & _MASK32))
    vocab = filtered.shape[-1]
    tokens = _mix32(torch.arange(vocab, device=seed.device, dtype=torch.long) + 0x632BE5AB)
    bits = _mix32(key[:, None] ^ tokens[None, :])
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1)
    return torch.argmax(filtered - torch.log(-torch.log(uniform)), dim=-1)


_compiled_draw: object = None


def _drawer(device: torch.device) -> object:
    """:func:`_draw`, fused into one kernel by ``torch.compile`` on CUDA (about 20 launches over
    a rows x vocabulary tensor otherwise); eager elsewhere or when compiling is turned off."""
    global _compiled_draw
    if device.type != "cuda" or os.environ.get("GENRM_HF_COMPILE", "1") == "0":
        return _draw
    if _compiled_draw is None:
        _compiled_draw = torch.compile(_draw, dynamic=True)
    return _compiled_draw


def sample(
    logits: torch.Tensor, rows: RowSampling, step: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw one token per row of float32 ``logits`` [rows, vocab]: (tokens, logprobs, raw).

    ``logprobs`` is ``log_softmax(logits / temperature)`` at the token — the temperature-scaled
    distribution, *before* top-k / top-p truncation; for a greedy row (temperature 0) it equals
    ``raw``, ``log_softmax(logits)`` (the model's own distribution at temperature 1).
    """
    raw = torch.log_softmax(logits, dim=-1)
    greedy_tokens = torch.argmax(logits, dim=-1)
    if rows.all_greedy:
        picked = raw.gather(1, greedy_tokens[:, None])[:, 0]
        return greedy_tokens, picked, picked
    greedy = rows.temperature <= 0.0
    temperature = torch.where(greedy, torch.ones_like(rows.temperature), rows.temperature)
    scaled = torch.log_softmax(logits / temperature[:, None], dim=-1)
    filtered = scaled
    vocab = logits.shape[-1]
    if rows.max_top_k > 0:
        k = min(rows.max_top_k, vocab)
        top = torch.topk(scaled, k, dim=-1).values
        kth = top.gather(1, (rows.top_k.clamp(1, k) - 1)[:, None])
        active = ((rows.top_k > 0) & (rows.top_k < vocab))[:, None]
        filtered = filtered.masked_fill(active & (filtered < kth), -float("inf"))
    if rows.any_top_p:
        sorted_lp, order = torch.sort(filtered, dim=-1, descending=True)
        probs = torch.softmax(sorted_lp, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
        drop = before >= rows.top_p[:, None]
        drop[:, 0] = False
        filtered = filtered.masked_fill(
            torch.zeros_like(drop).scatter(1, order, drop), -float("inf")
        )
    step_t = torch.full((), step, dtype=torch.long, device=logits.device)  # a fill, no copy
    try:
        drawn = _drawer(logits.device)(filtered, rows.seed, step_t)  # type: ignore[operator]
    except Exception:
        if _drawer(logits.device) is _draw:
            raise
        global _compiled_draw
        _compiled_draw = _draw  # the compiler failed here: eager from now on
        drawn = _draw(filtered, rows.seed, step_t)
    tokens = torch.where(greedy, greedy_tokens, drawn)
    picked_raw = raw.gather(1, tokens[:, None])[:, 0]
    picked = torch.where(greedy, picked_raw, scaled.gather(1, tokens[:, None])[:, 0])
    return tokens, picked, picked_raw
