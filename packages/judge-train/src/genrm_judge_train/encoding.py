"""Examples as the engine sees them, and in batches.

The adapter is only worth its loss if the prompt it is trained on is token for token the prompt
the hf engine renders at serving time: so the prompt goes through the engine's own
:class:`~genrm_serve.engines.prompts.PromptEncoder` (the plain chat template for a base model),
and the target is a one-token verdict ("1" or "0") followed by the end-of-text token.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from genrm_judge_train.examples import JudgeExample
from genrm_rewards.dapo_genrm import build_messages
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.prompts import PromptEncoder

#: One encoded example: the prompt's token ids and its verdict (1 or 0).
Item = tuple[list[int], int]

T = TypeVar("T")


class Tokenised:
    """Examples as the engine would see them: prompt ids, and the verdict + stop tokens."""

    def __init__(self, model_dir: Path, max_len: int) -> None:
        from transformers import AutoTokenizer

        self.encoder = PromptEncoder(AutoTokenizer.from_pretrained(model_dir), max_len)
        tok = self.encoder.tokenizer
        self.verdict_ids = {v: self._single(tok, str(v)) for v in (0, 1)}
        self.stop_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id)
        self.max_len = max_len

    @staticmethod
    def _single(tok: Any, text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise SystemExit(f"the tokenizer splits {text!r} into {ids}: not a one-token verdict")
        return int(ids[0])

    def prompt_ids(self, e: JudgeExample) -> list[int]:
        from genrm_client.types import Message, SamplingParams

        messages = build_messages(e.question, e.label, e.response)
        request = EngineRequest(
            sampling=SamplingParams(), messages=[Message.model_validate(m) for m in messages]
        )
        return self.encoder.encode(request)[-self.max_len :]

    def items(self, examples: list[JudgeExample]) -> list[Item]:
        return [(self.prompt_ids(e), e.verdict) for e in examples]

    def targets(self, verdicts: list[int]) -> torch.Tensor:
        """Per row, the verdict token and the stop token after it."""
        return torch.tensor([[self.verdict_ids[v], self.stop_id] for v in verdicts])


def batches(
    items: list[T], size: int, rng: random.Random, key: Callable[[T], int]
) -> list[list[T]]:
    """Batches of similar length (less padding), in a seeded random order."""
    order = list(items)
    rng.shuffle(order)
    out: list[list[T]] = []
    window = size * 16
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=key)
        out.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
    rng.shuffle(out)
    return out


def collate(
    batch: list[Item], tok: Tokenised
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``prompt + verdict`` rows, their mask and positions, and the 2 targets."""
    seqs = [[*ids, tok.verdict_ids[v]] for ids, v in batch]
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, mask, positions, tok.targets([v for _, v in batch])


def collate_states(
    rows: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded cached states, their mask and positions (as ``collate`` lays out ids)."""
    width = max(r.shape[0] for r in rows)
    states = torch.zeros((len(rows), width, rows[0].shape[1]), dtype=torch.float32)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        states[i, width - r.shape[0] :] = r.float()
        mask[i, width - r.shape[0] :] = 1
    return states, mask, (mask.cumsum(-1) - 1).clamp(min=0)
