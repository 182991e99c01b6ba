"""The held-out score a run records: greedy over the whole vocabulary, as the engine decodes.

A training loss over the two target tokens says nothing about what else the model might
prefer; the engine decodes greedily over all 262k tokens, so the check does too, and counts the
replies that are not a clean verdict and stop (``clean_reply_rate``). It is the in-script
number only: ``benchmarks/judge_agreement.py`` measures through the real engine.
"""

from __future__ import annotations

from typing import Any

import torch

from genrm_judge_train.encoding import Item, Tokenised, collate


def last_logits(model: Any, input_ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> Any:
    """Logits at the last two positions only (the verdict's and the stop token's)."""
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, logits_to_keep=2)
    return out.logits.float()


def evaluate(
    model: Any,
    items: list[Item],
    tok: Tokenised,
    autocast: bool,
    size: int,
    device: str = "cpu",
) -> dict[str, float]:
    """Greedy verdict over the full vocabulary: agreement, and replies that are not 1/0 + stop."""
    model.eval()
    agree = clean = 0
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            ids, mask, pos, targets = (t.to(device) for t in collate(chunk, tok))
            pred = last_logits(model, ids, mask, pos).argmax(-1).cpu()
            targets = targets.cpu()
            agree += int((pred[:, 0] == targets[:, 0]).sum())
            verdict_tokens = torch.tensor(list(tok.verdict_ids.values()))
            clean += int(
                (torch.isin(pred[:, 0], verdict_tokens) & (pred[:, 1] == tok.stop_id)).sum()
            )
    model.train()
    return {"agreement": agree / len(items), "clean_reply_rate": clean / len(items)}
