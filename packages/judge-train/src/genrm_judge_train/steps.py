"""The training steps: AdamW, a warm-up then a cosine schedule, and the two-token loss.

The loss is the cross-entropy of the verdict token after the prompt plus half that of the
end-of-text token after the verdict (a bare "1"/"0" that stops), computed at those two
positions only (``logits_to_keep``), never over the 262k-token vocabulary at every position:
that is what makes a CPU run possible. A step whose gradients are not finite is dropped, not
applied: one such update turns every LoRA weight into NaN.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from genrm_judge_train.encoding import Item, Tokenised, batches, collate, collate_states

logger = logging.getLogger(__name__)

#: Steps with non-finite gradients dropped before the run stops (or one in 50, if more). One
#: such step, applied, turns every LoRA weight into NaN: seen on an H200 at step ~115 of a
#: bs-64 run, with the loss 0.28 ten steps before.
MAX_SKIPPED = 5


@dataclass(frozen=True)
class Schedule:
    """How many steps of what size, at what learning rate, and when to stop early."""

    steps: int
    batch_size: int
    lr: float
    warmup: int
    seed: int
    stop_after: int = 0  # stop after this many steps of the schedule (0: never)
    max_train_s: float = 0  # stop the steps after this many seconds (0: never)

    def lr_factor(self, step: int) -> float:
        """Linear warm-up, then a cosine down to a tenth of the rate at the last step."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass
class StepInputs:
    """What a batch of example indices becomes for the model: the cut model's cached states
    (``cache`` set), or the whole prompts on ``device``."""

    items: list[Item]
    tok: Tokenised
    cache: list[torch.Tensor] | None
    device: str
    autocast: bool

    def length(self, i: int) -> int:
        return len(self.cache[i]) if self.cache is not None else len(self.items[i][0])

    def logits(self, model: Any, batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The two positions' logits of a batch, and its targets."""
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast):
            if self.cache is not None:
                states, mask, pos = collate_states([self.cache[i] for i in batch])
                targets = self.tok.targets([self.items[i][1] for i in batch])
                out = model(
                    inputs_embeds=states, attention_mask=mask, position_ids=pos, logits_to_keep=2
                )
            else:
                ids, mask, pos, targets = (
                    t.to(self.device) for t in collate([self.items[i] for i in batch], self.tok)
                )
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=2)
        return out.logits.float(), targets


@dataclass
class StepLog:
    """What the steps did: the verdict losses of the applied steps, the dropped steps."""

    started: float
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # steps whose update was dropped


def plan(inputs: StepInputs, schedule: Schedule) -> list[list[int]]:
    """The batches of example indices, one per step: epochs of length-sorted batches."""
    rng = random.Random(schedule.seed)
    indices = list(range(len(inputs.items)))
    out: list[list[int]] = []
    while len(out) < schedule.steps:
        out.extend(batches(indices, schedule.batch_size, rng, key=inputs.length))
    return out[: schedule.steps]


def run_steps(
    model: Any, params: list[torch.nn.Parameter], inputs: StepInputs, schedule: Schedule
) -> StepLog:
    """Train ``params`` of ``model`` for the schedule's steps (or until it says stop)."""
    opt = torch.optim.AdamW(params, lr=schedule.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule.lr_factor)
    steps = plan(inputs, schedule)
    model.train()
    log = StepLog(started=time.monotonic())
    for step, batch in enumerate(steps, start=1):
        log.steps = step
        logits, targets = inputs.logits(model, batch)
        loss_verdict = torch.nn.functional.cross_entropy(logits[:, 0], targets[:, 0])
        loss_stop = torch.nn.functional.cross_entropy(logits[:, 1], targets[:, 1])
        loss = loss_verdict + 0.5 * loss_stop
        torch.autograd.backward(loss)
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        if torch.isfinite(norm):  # a non-finite loss gives a non-finite norm too
            opt.step()
            log.losses.append(float(loss_verdict.detach()))
        else:
            _drop(log, step, float(loss.detach()), [len(inputs.items[i][0]) for i in batch])
        sched.step()
        opt.zero_grad(set_to_none=True)
        _report(log, step, schedule.steps)
        if _stop_early(log, step, schedule):
            break
    return log


def _drop(log: StepLog, step: int, loss: float, widths: list[int]) -> None:
    """Record a step whose update was dropped; stop the run when too many were."""
    log.skipped.append(step)
    logger.warning(
        "step %d: non-finite gradient norm (loss %s; prompts of %d-%d tokens): skipped",
        step,
        loss,
        min(widths),
        max(widths),
    )
    if len(log.skipped) > max(MAX_SKIPPED, step // 50):
        raise SystemExit(
            f"{len(log.skipped)} of {step} steps had non-finite gradients (steps "
            f"{log.skipped[:8]}...): stopped before they ruin the adapter; the warnings above "
            "give each one's prompt lengths"
        )


def _report(log: StepLog, step: int, total: int) -> None:
    if log.losses and (step % 10 == 0 or step == 1):
        elapsed = time.monotonic() - log.started
        logger.info(
            "step %d/%d loss(verdict) %.4f (last 10: %.4f) %.1f s/step",
            step,
            total,
            log.losses[-1],
            sum(log.losses[-10:]) / len(log.losses[-10:]),
            elapsed / step,
        )


def _stop_early(log: StepLog, step: int, schedule: Schedule) -> bool:
    if schedule.stop_after and step >= schedule.stop_after:
        logger.info("stopping after %d steps: --stop-after", step)
        return True
    if schedule.max_train_s and time.monotonic() - log.started > schedule.max_train_s:
        logger.info("stopping after %d steps: --max-train-s reached", step)
        return True
    return False
