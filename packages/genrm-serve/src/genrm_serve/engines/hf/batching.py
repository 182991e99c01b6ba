"""The rows of an hf batch, which chunk each goes into, and what a finished row reports.

Memory is bounded by construction, not by free RAM: a batch is split into chunks of at most
``engine_config.max_batch_size`` rows that hold at most the engine's batch token budget at once
(:data:`~genrm_serve.engines.hf.engine.MAX_BATCH_TOKENS`, or what ``mem_fraction_static``
leaves beside the weights) — the packed prefill's unique tokens, plus prompt + new tokens of
static cache for each row that decodes past its first token. Rows are taken in prompt order, so
that a group's rows (which share a prefix) stay in one chunk and its prefix is computed once.

This is the engine's scheduling, kept apart from the model (``engine.py``): it needs no model,
no device and no tokenizer, only the rows' token ids and lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from genrm_client.types import FinishReason
from genrm_serve.engines.base import EngineOutput, EngineRequest
from genrm_serve.engines.prefix_tree import common_prefix_len

if TYPE_CHECKING:
    import torch

__all__ = ["Row", "added_cost", "chunk_cost", "split_chunks"]


@dataclass
class Row:
    """One request of a batch, from its prompt's token ids to its finished reply."""

    request: EngineRequest
    prompt: list[int]
    max_new: int
    #: 32-bit key of this row's sampling noise (the request's seed, or a fresh random one)
    seed: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    raw_logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text: str = ""
    #: with ``sampling.logprob_verdict``: P("1") / (P("1") + P("0")) at the first reply token
    verdict_prob: float | None = None
    #: prompt tokens computed once with other rows of its chunk (the shared prefix)
    shared_prompt_tokens: int = 0

    def hits_stop(self, text: str) -> bool:
        """Whether ``text`` (the reply so far) contains one of the request's stop strings."""
        return any(s and s in text for s in self.request.sampling.stop or [])

    def finish(
        self,
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        raw: torch.Tensor,
        *,
        eos_ids: Collection[int],
        decode: Callable[[list[int]], str],
    ) -> None:
        """Record the reply: EOS first, then a stop string, else its length ran out."""
        n = len(tokens)
        self.tokens = tokens.tolist()
        self.logprobs = logprobs[:n].tolist()
        self.raw_logprobs = raw[:n].tolist()
        if self.tokens[-1] in eos_ids:
            self.finish_reason = "stop"
            self.text = decode(self.tokens[:-1])
            return
        text = decode(self.tokens)
        stops = self.request.sampling.stop or []
        cut = min((i for s in stops if s and (i := text.find(s)) >= 0), default=None)
        if cut is not None:
            self.finish_reason, self.text = "stop", text[:cut]
        else:
            self.finish_reason, self.text = "length", text

    def output(self, elapsed: float, weight_version: int, extra: dict[str, Any]) -> EngineOutput:
        """The finished row as the engine's answer (``extra``: who answered)."""
        assert self.finish_reason is not None
        out = EngineOutput(
            text=self.text,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt),
            completion_tokens=len(self.tokens),
            latency_s=elapsed,
            weight_version=weight_version,
            extra={**extra, "cached_prompt_tokens": self.shared_prompt_tokens},
        )
        if self.verdict_prob is not None:
            out.extra["verdict_prob"] = self.verdict_prob
        if self.request.return_tokens:
            out.token_ids = list(self.tokens)
            out.logprobs = list(self.logprobs)
            out.raw_logprobs = list(self.raw_logprobs)
            out.extra["prompt_token_ids"] = list(self.prompt)
        return out


def added_cost(row: Row, before: Row | None) -> int:
    """Tokens ``row`` adds to a chunk of sorted rows whose last row is ``before``: its own part of
    the packed prefill (a sorted list's radix tree holds each prompt less its common prefix with
    the prompt before it; runs shorter than ``MIN_SHARED_TOKENS`` repeat, a few tokens more)
    and, when it decodes on, its static K/V cache of prompt + new tokens."""
    shared = common_prefix_len(before.prompt, row.prompt) if before is not None else 0
    cache = len(row.prompt) + row.max_new if row.max_new > 1 else 0
    return len(row.prompt) - shared + cache


def chunk_cost(rows: list[Row]) -> int:
    """Tokens a chunk of sorted ``rows`` holds at once (see :func:`added_cost`)."""
    return sum(added_cost(r, rows[i - 1] if i else None) for i, r in enumerate(rows))


def _weakest_link(rows: list[Row], following: Row) -> int:
    """Where to cut ``rows`` (then ``following``): in the second half, at the neighbours that
    share the shortest prefix (the last such place on a tie)."""
    seq = [*rows, following]
    best, best_shared = len(rows), None
    for i in range(len(rows), max(1, len(rows) // 2) - 1, -1):
        shared = common_prefix_len(seq[i - 1].prompt, seq[i].prompt)
        if best_shared is None or shared < best_shared:
            best, best_shared = i, shared
    return best


def split_chunks(rows: list[Row], max_rows: int, max_tokens: int) -> list[list[Row]]:
    """Sub-batches of at most ``max_rows`` rows and ``max_tokens`` tokens (:func:`chunk_cost`).

    Rows are taken in prompt order, so the rows that share a prefix (a GRPO group) are
    neighbours; a full chunk is cut, in its second half, where neighbours share the least,
    so that a group stays in one chunk unless it alone exceeds the budget.
    """
    chunks: list[list[Row]] = []
    current: list[Row] = []
    cost = 0
    for row in sorted(rows, key=lambda r: r.prompt):
        while current and (
            len(current) >= max_rows or cost + added_cost(row, current[-1]) > max_tokens
        ):
            cut = _weakest_link(current, row)
            chunks.append(current[:cut])
            current = current[cut:]
            cost = chunk_cost(current)
        cost += added_cost(row, current[-1] if current else None)
        current.append(row)
    if current:
        chunks.append(current)
    return chunks
