"""The training steps on a toy model: the schedule, the seeded plan, the dropped steps.

The real model takes minutes on a CPU; what the step loop decides (which batch when, at which
rate, which updates are dropped and when the run stops) does not depend on it.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from genrm_judge_train.encoding import Tokenised, batches, collate
from genrm_judge_train.steps import MAX_SKIPPED, Schedule, StepInputs, plan, run_steps

VOCAB = 6


def _tok() -> Tokenised:
    tok = Tokenised.__new__(Tokenised)  # no tokenizer: the toy vocabulary's ids
    tok.verdict_ids, tok.stop_id, tok.pad_id, tok.max_len = {0: 1, 1: 2}, 3, 0, 16
    return tok


class _Toy(torch.nn.Module):
    """Logits at the last two positions from a bag of the row's tokens (``poison``: NaN)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 8)
        self.out = torch.nn.Linear(8, VOCAB)
        self.poison = False

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int, **_: Any) -> Any:
        h = self.emb(input_ids)[:, -logits_to_keep:]
        logits = self.out(h)
        return SimpleNamespace(logits=logits * math.nan if self.poison else logits)


def _inputs(n: int = 24) -> StepInputs:
    rng = random.Random(0)
    items = [
        ([rng.randrange(4, VOCAB) for _ in range(rng.randrange(2, 9))], i % 2) for i in range(n)
    ]
    return StepInputs(items, _tok(), cache=None, device="cpu", autocast=False)


def test_warm_up_then_cosine_down_to_a_tenth() -> None:
    s = Schedule(steps=110, batch_size=4, lr=1e-3, warmup=10, seed=0)
    assert [s.lr_factor(i) for i in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert s.lr_factor(10) == 1.0 and s.lr_factor(60) == pytest.approx(0.55)
    assert s.lr_factor(110) == pytest.approx(0.1) and s.lr_factor(500) == pytest.approx(0.1)
    assert Schedule(steps=5, batch_size=1, lr=1, warmup=0, seed=0).lr_factor(0) == 1.0


def test_batches_hold_similar_lengths_in_a_seeded_order() -> None:
    lengths = list(range(100))
    out = batches(lengths, 4, random.Random(3), key=lambda x: x)
    assert sorted(x for b in out for x in b) == lengths
    assert all(b == sorted(b) for b in out)  # each batch from one sorted window
    assert out == batches(lengths, 4, random.Random(3), key=lambda x: x)
    assert out != batches(lengths, 4, random.Random(4), key=lambda x: x)


def test_the_plan_is_epochs_of_every_example_cut_at_the_steps() -> None:
    inputs = _inputs(24)
    steps = plan(inputs, Schedule(steps=15, batch_size=4, lr=1e-3, warmup=0, seed=7))
    assert len(steps) == 15
    assert sorted(i for b in steps[:6] for i in b) == list(range(24))  # one epoch: 6 batches
    assert steps == plan(inputs, Schedule(steps=15, batch_size=4, lr=1e-3, warmup=0, seed=7))


def test_collate_left_pads_the_prompt_and_its_verdict() -> None:
    ids, mask, pos, targets = collate([([4, 5], 1), ([5], 0)], _tok())
    assert ids.tolist() == [[4, 5, 2], [0, 5, 1]]
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1]] and pos.tolist() == [[0, 1, 2], [0, 0, 1]]
    assert targets.tolist() == [[2, 3], [1, 3]]


def test_the_steps_lower_the_loss_and_stop_where_told() -> None:
    torch.manual_seed(0)
    model, inputs = _Toy(), _inputs()
    params = list(model.parameters())
    log = run_steps(
        model, params, inputs, Schedule(steps=40, batch_size=8, lr=5e-2, warmup=2, seed=0)
    )
    assert log.steps == 40 and len(log.losses) == 40 and log.skipped == []
    assert sum(log.losses[-5:]) < sum(log.losses[:5])
    short = Schedule(steps=40, batch_size=8, lr=5e-2, warmup=2, seed=0, stop_after=3)
    assert run_steps(model, params, inputs, short).steps == 3


# No update is applied, so torch warns that the schedule steps before the optimiser does.
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_non_finite_steps_are_dropped_then_the_run_stops() -> None:
    model, inputs = _Toy(), _inputs()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    model.poison = True
    with pytest.raises(SystemExit, match=f"^{MAX_SKIPPED + 1} of {MAX_SKIPPED + 1} steps had"):
        run_steps(
            model, params, inputs, Schedule(steps=40, batch_size=8, lr=5e-2, warmup=0, seed=0)
        )
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True))  # none applied
