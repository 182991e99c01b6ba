"""Fixes from a review of the GRPO core, each pinned by a test.

Aborted generations are neither judged nor trained; a response cut off at the length limit is
judged but not trained, unless the run keeps cut-off responses; the group baseline and the loss
use one membership rule; extreme log-ratios cannot make the gradient NaN; sampling seeds never
collide across steps, groups or evaluation.
"""

import itertools

import torch

from genrm_serve import EngineOutput
from rl_core.config import build_config
from rl_core.grpo.advantages import sample_advantages
from rl_core.grpo.loss import LossConfig, grpo_loss
from rl_core.rewards import judgeable
from rl_core.rollout import SEED_EVAL, SEED_TRAIN, RolloutSettings, fill_sample, sample_seed
from rl_core.sample import Sample
from rl_core.trainer import train_items, untrained_reason


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


def _cfg(tmp_path, **kw):
    return build_config(
        hf_checkpoint="m", prompt_data="d.jsonl", rm_type="math", run_dir=str(tmp_path), **kw
    )


def test_the_baseline_uses_only_the_samples_in_the_loss():
    # the third sample has a reward but was aborted: it must not move the others' baseline
    batch = _scored([1.0, 0.0, 1.0], ["ok", "ok", "aborted"])
    sample_advantages(batch)
    clean = _scored([1.0, 0.0], ["ok", "ok"])
    sample_advantages(clean)
    assert [s.advantage for s in batch[:2]] == [s.advantage for s in clean]
    assert batch[2].advantage == 0.0


def test_a_response_cut_off_at_the_length_limit_stays_out_of_the_loss_and_the_baseline(tmp_path):
    """Its reward judges an answer the policy never finished: a judged 1 for ' 7EPOCH' (label 7)
    must neither train the policy nor raise its group's mean."""
    assert not _cfg(tmp_path).keep_cut_off  # the default
    batch = _scored([1.0, 0.0, 1.0], ["ok", "ok", "ok"])
    batch[2].finish_reason = "length"
    sample_advantages(batch)
    clean = _scored([1.0, 0.0], ["ok", "ok"])
    sample_advantages(clean)
    assert [s.advantage for s in batch[:2]] == [s.advantage for s in clean]
    assert batch[2].left_out == "cut_off" and not batch[2].in_loss and batch[2].advantage == 0.0
    assert batch[0].in_loss and batch[1].in_loss
    assert [it.in_loss for it in train_items(batch)] == [True, True, False]


def test_keep_cut_off_trains_on_a_cut_off_response(tmp_path, char_tokenizer):
    """--keep-cut-off: the rollout marks its samples, and a cut-off response is in the loss and
    in its group's baseline like a finished one."""
    cfg = _cfg(tmp_path, keep_cut_off=True)
    assert cfg.keep_cut_off
    settings = RolloutSettings(2, 2, keep_cut_off=cfg.keep_cut_off)
    batch = _scored([1.0, 0.0, 1.0], ["ok", "ok", "ok"])
    fill_sample(batch[2], _out("length"), char_tokenizer, settings)
    assert batch[2].cut_off and batch[2].keep_cut_off and batch[2].in_loss
    sample_advantages(batch)
    full = _scored([1.0, 0.0, 1.0], ["ok", "ok", "ok"])
    sample_advantages(full)
    assert [s.advantage for s in batch] == [s.advantage for s in full]
    assert batch[2].advantage != 0.0
    # without the flag, the same output leaves the sample out
    dropped = _scored([1.0], ["ok"])[0]
    fill_sample(dropped, _out("length"), char_tokenizer, RolloutSettings(2, 2))
    assert dropped.cut_off and not dropped.in_loss


def test_a_step_with_no_sample_in_the_loss_says_why():
    cut = _scored([1.0, 0.0, 1.0, 0.0], ["ok"] * 4)
    for s in cut:
        s.finish_reason = "length"
    assert untrained_reason(cut, 256) == "all 4 responses hit --rollout-max-response-len 256"
    mixed = _scored([None, 1.0, 0.0, 1.0], ["judge_error", "ok", "ok", "aborted"])
    for s in mixed[1:3]:
        s.finish_reason = "length"
    assert untrained_reason(mixed, 4) == (
        "none of the 4 samples is in the loss (2 cut off at --rollout-max-response-len 4, "
        "1 with a judge error, 1 aborted by the engine)"
    )
    mixed[3].status = "ok"
    assert untrained_reason(mixed, 4) is None  # one sample is in: the step trains


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
