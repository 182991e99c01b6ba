"""Fixes from a review of the GRPO core, each pinned by a test.

Aborted generations are neither judged nor trained; the group baseline and the loss use one
membership rule; extreme log-ratios cannot make the gradient NaN; sampling seeds never collide
across steps, groups or evaluation.
"""

import itertools

import torch

from genrm_serve import EngineOutput
from rl_core.config import build_config
from rl_core.grpo.loss import LossConfig, grpo_loss
from rl_core.rewards import judgeable
from rl_core.rollout import SEED_EVAL, SEED_TRAIN, RolloutSettings, fill_sample, sample_seed
from rl_core.sample import Sample
from rl_core.trainer import GRPOTrainer


def _out(finish: str) -> EngineOutput:
    return EngineOutput(
        text="7",
        finish_reason=finish,
        prompt_tokens=3,
        completion_tokens=2,
        token_ids=[5, 6],
        logprobs=[-0.1, -0.2],
        weight_version=0,
    )


def test_an_aborted_generation_is_neither_judged_nor_trained(char_tokenizer):
    done, cut = Sample("p", "7", {}, 0), Sample("p", "7", {}, 0, index=1)
    fill_sample(done, _out("stop"), char_tokenizer, RolloutSettings(2, 4))
    fill_sample(cut, _out("abort"), char_tokenizer, RolloutSettings(2, 4))
    assert cut.status == "aborted" and done.status == "pending"
    assert judgeable([done, cut]) == [done]
    cut.reward = 1.0  # even with a reward it stays out of the loss and the group statistics
    assert not cut.in_loss


def _scored(rewards, statuses):
    out = []
    for i, (r, st) in enumerate(zip(rewards, statuses, strict=True)):
        s = Sample("p", "1", {}, 0, index=i, response_tokens=[5])
        s.reward, s.status = r, st
        out.append(s)
    return out


def test_the_baseline_uses_only_the_samples_in_the_loss(tmp_path):
    cfg = build_config(
        hf_checkpoint="m", prompt_data="d.jsonl", rm_type="math", run_dir=str(tmp_path)
    )
    trainer = GRPOTrainer.__new__(GRPOTrainer)  # only its advantage rule is under test
    trainer.cfg = cfg
    # the third sample has a reward but was aborted: it must not move the others' baseline
    batch = _scored([1.0, 0.0, 1.0], ["ok", "ok", "aborted"])
    trainer.advantages(batch)
    clean = _scored([1.0, 0.0], ["ok", "ok"])
    trainer.advantages(clean)
    assert [s.advantage for s in batch[:2]] == [s.advantage for s in clean]
    assert batch[2].advantage == 0.0


def test_an_extreme_log_ratio_keeps_the_gradient_finite():
    logp = torch.tensor([-0.5, -200.0, -0.1], requires_grad=True)
    old = torch.tensor([-0.5, -0.1, -150.0])
    cfg = LossConfig(use_kl_loss=True, kl_loss_coef=0.1, use_tis=True)
    parts = grpo_loss(
        logp,
        old,
        torch.tensor([1.0, -1.0, 1.0]),
        torch.ones(3),
        cfg,
        total_tokens=3.0,
        ref_logprobs=torch.tensor([-300.0, -0.1, -0.1]),
        rollout_logprobs=torch.tensor([-0.5, -120.0, -0.1]),
    )
    parts.loss.backward()
    assert torch.isfinite(parts.loss) and torch.isfinite(logp.grad).all()


def test_seeds_never_collide_across_steps_groups_and_evaluation():
    train = {
        sample_seed(1234, SEED_TRAIN, step, g, i)
        for step, g, i in itertools.product(range(4), range(256), range(8))
    }
    assert len(train) == 4 * 256 * 8  # a rollout batch of 256 prompts, 4 steps: all distinct
    evals = {sample_seed(1234, SEED_EVAL, 1, g, 0) for g in range(256)}
    assert not evals & train
    assert sample_seed(1234, SEED_TRAIN, 0, 0, 0) == sample_seed(1234, SEED_TRAIN, 0, 0, 0)
