"""The GRPO driver end to end, in one process: tiny model, test engine, scripted rewards.

Checks what a user relies on: rewards reach the advantages, weights change and the rollout engine
serves each new version, judge failures are masked (and too many stop the run), defer-swap puts
the engines in the expected states, fully-async trains on at most 1-step-stale samples, a
resumed run takes the same next step as an uninterrupted one, and a response cut off at the
length limit stays out of the loss (a run with nothing else to train on stops and says why).
"""

import dataclasses

import pytest
import torch
from rich.console import Console
from tiny_grpo import ScriptedReward

from rl_core.metrics import read_metrics
from rl_core.rewards import JudgeFailureError, custom_post_process
from rl_core.summary import render_summary
from rl_core.trainer import NothingToTrainError


def _record_batches(trainer) -> list:
    """The batches each step finishes with, in order (``finish_step`` still runs)."""
    batches: list = []
    orig = trainer.finish_step

    async def spy(step, batch, *rest):
        batches.append(batch)
        await orig(step, batch, *rest)

    trainer.finish_step = spy
    return batches


async def test_two_steps_train_and_sync(tmp_path, grpo_config, grpo_trainer):
    cfg = grpo_config(tmp_path)
    reward = ScriptedReward(fail_every=5)
    trainer, engine, backend = await grpo_trainer(cfg, reward=reward)
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    history = await trainer.run()

    assert [h.step for h in history] == [1, 2]
    assert engine.weight_version == 2 == trainer.weight_version
    changed = [k for k, v in backend.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no weight changed"
    for k, v in engine.model.state_dict().items():  # the engine serves the trained weights
        assert torch.equal(v, backend.model.state_dict()[k]), k
    records = read_metrics(cfg.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert sum(r["rollout/judge_errors"] for r in records) == (2 * 8) // 5
    assert all(r["train/optimizer_steps"] == 1 for r in records)
    assert all("time/rollout" in r and "time/train" in r for r in records)
    # every handoff of the step is timed, and the weights went by the object store (CPU)
    for r in records:
        assert r["weights/sync_path"] == "object_store"
        assert {"offload/actor_s", "onload/actor_s"} <= {
            k.removeprefix("handoff/") for k in r if k.startswith("handoff/")
        }
    assert [r["weights/version"] for r in records] == [1, 2]


async def test_judge_errors_masked_and_out_of_the_baseline(tmp_path, grpo_config, grpo_trainer):
    cfg = grpo_config(tmp_path, num_rollout=1)
    trainer, _, _ = await grpo_trainer(
        cfg,
        reward=ScriptedReward(fail_every=3),
    )
    batches = _record_batches(trainer)
    await trainer.run()
    (batch,) = batches
    failed = [s for s in batch if s.status == "judge_error"]
    assert failed and all(not s.in_loss and s.advantage == 0.0 for s in failed)
    for gid in {s.group_id for s in batch}:
        ok = [s for s in batch if s.group_id == gid and s.reward is not None]
        rewards = {s.reward for s in ok}
        if len(rewards) > 1:  # rewards differ → every valid sample has a non-zero advantage
            assert all(s.advantage != 0.0 for s in ok)
            mean = sum(s.reward for s in ok) / len(ok)
            assert all((s.advantage > 0) == (s.reward > mean) for s in ok)


async def test_too_many_judge_errors_stop_the_run(tmp_path, grpo_config, grpo_trainer):
    cfg = grpo_config(tmp_path, num_rollout=1)
    trainer, _, _ = await grpo_trainer(
        cfg,
        reward=ScriptedReward(fail_every=1),
    )
    with pytest.raises(JudgeFailureError, match=r"^step 1: 8 of 8 samples have no reward"):
        await trainer.run()


async def test_defer_swap_states(tmp_path, grpo_config, grpo_trainer):
    cfg = grpo_config(tmp_path, num_rollout=1, rm_type="dummy", defer_reward_to_post_process=True)
    log: list = []
    trainer, engine, _ = await grpo_trainer(
        cfg,
        deferred=True,
        judge_log=log,
    )
    await trainer.run()
    scored = [e for e in log if isinstance(e, tuple)]
    assert scored == [
        (
            "scored",
            {"rollout": "asleep", "genrm:__default__": "active", "actor": "asleep"},
            "asleep",
        )
    ]
    # judge asleep during rollout, woken for the batch, asleep again before training
    names = [e for e in log if isinstance(e, str)]
    assert names == ["judge.sleep", "judge.wake", "judge.sleep"]
    transitions = [(p, w, a) for p, w, a in trainer.phases.log]
    assert transitions.index(("reward", "rollout", "sleep")) < transitions.index(
        ("reward", "genrm:__default__", "wake")
    )
    assert ("train", "actor", "wake") in transitions
    assert engine.state == "awake" and engine.weight_version == 1


async def test_custom_post_process_hook(tmp_path, grpo_config, grpo_trainer):
    cfg = grpo_config(tmp_path, num_rollout=1, rm_type="dummy", defer_reward_to_post_process=True)
    seen = []

    async def hook(args, samples):
        seen.append(len(samples))
        return [{"score": float(i % 2), "status": "ok"} for i in range(len(samples))]

    trainer, _, _ = await grpo_trainer(cfg, deferred=True, judge_log=[])
    trainer.rewards.post_process = custom_post_process(hook)
    history = await trainer.run()
    assert seen == [8] and history[0].metrics["rollout/reward_mean"] == 0.5


async def test_fully_async_overlaps_with_staleness_one(tmp_path, grpo_config, grpo_trainer):
    cfg = grpo_config(tmp_path, num_rollout=3, fully_async=True)
    trainer, engine, _ = await grpo_trainer(cfg)
    versions = []
    orig = trainer.train

    async def spy(batch):  # the policy's version when it trains on the batch
        versions.append((trainer.weight_version, {s.weight_version for s in batch}))
        return await orig(batch)

    trainer.train = spy
    await trainer.run()
    assert engine.weight_version == 3
    # step k+1's rollout started before step k's weights existed: one version behind
    assert versions[0] == (0, {0})
    assert all(pv - max(sv) <= 1 for pv, sv in versions)
    assert any(pv - min(sv) == 1 for pv, sv in versions[1:])


async def test_resume_matches_uninterrupted(tmp_path, grpo_config, grpo_trainer):
    straight_cfg = grpo_config(tmp_path / "a", num_rollout=2)
    straight, _, sb = await grpo_trainer(straight_cfg)
    await straight.run()

    first_cfg = grpo_config(tmp_path / "b", num_rollout=1, save=str(tmp_path / "ckpt"))
    first, _, _ = await grpo_trainer(first_cfg)
    await first.run()
    resumed_cfg = grpo_config(tmp_path / "c", num_rollout=2, load=str(tmp_path / "ckpt"))
    resumed, engine, rb = await grpo_trainer(resumed_cfg)
    history = await resumed.run()
    assert [h.step for h in history] == [2] and engine.weight_version == 2
    assert (
        history[0].metrics["rollout/reward_mean"]
        == straight.history[1].metrics["rollout/reward_mean"]
    )
    for k, v in sb.model.state_dict().items():
        assert torch.allclose(v, rb.model.state_dict()[k], atol=1e-6), k


async def test_a_step_whose_responses_are_all_cut_off_trains_nothing_and_says_why(
    tmp_path, grpo_config, grpo_trainer
):
    """The default rule: every response hits the limit, so no sample is in the loss. Each step
    is judged and recorded, trains nothing and says why; the second such step in a row stops
    the run with an error naming the flag, its value and the rule."""
    cfg = grpo_config(tmp_path, num_rollout=4, keep_cut_off=False, max_untrained_steps=2)
    assert not cfg.keep_cut_off
    trainer, engine, backend = await grpo_trainer(cfg)
    generate = engine.generate

    async def never_finishes(requests):  # the odd response that wrote EOS is cut off too
        outs = await generate(requests)
        return [dataclasses.replace(o, finish_reason="length") for o in outs]

    engine.generate = never_finishes
    before = {k: v.clone() for k, v in backend.model.state_dict().items()}
    trained = []
    orig = trainer.train

    async def spy(batch):
        trained.append(batch)
        return await orig(batch)

    trainer.train = spy
    with pytest.raises(
        NothingToTrainError,
        match=r"^steps 1-2: no sample was in the loss, 2 steps in a row \(--max-untrained-steps "
        r"2\); step 2: all 8 responses hit --rollout-max-response-len 6; .*--keep-cut-off",
    ):
        await trainer.run()
    assert trained == []  # no optimizer step ...
    assert engine.weight_version == 0 == trainer.weight_version  # ... and no weight sync
    for k, v in backend.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    records = read_metrics(cfg.run_dir)
    assert [r["step"] for r in records] == [1, 2]  # both steps are recorded before the stop
    for r in records:
        assert r["rollout/truncated"] == 8 and r["rollout/in_loss"] == 0
        assert r["rollout/reward_samples"] == 8  # judged all the same
        assert r["train/untrained"] == 1
        assert r["train/untrained_reason"] == "all 8 responses hit --rollout-max-response-len 6"
        assert r["adv/nonzero"] == 0
    assert [h.untrained for h in trainer.history] == [records[0]["train/untrained_reason"]] * 2

    console = Console(record=True, width=200)
    render_summary(trainer.history, mode="colocate", console=console)
    text = console.export_text()
    assert "step 1 trained nothing: all 8 responses hit --rollout-max-response-len 6" in text
    assert "step 1: 8 of 8, step 2: 8 of 8" in text  # the responses cut off per step


async def test_cut_off_responses_stay_out_of_a_step_that_trains(
    tmp_path, grpo_config, grpo_trainer
):
    """A digit ends a response (a stop string), so some responses finish and the others are cut
    off: the step trains on the finished ones only, and a cut-off response moves no baseline."""
    cfg = grpo_config(
        tmp_path,
        num_rollout=1,
        keep_cut_off=False,
        rollout_stop=list("0123456789"),
        rollout_batch_size=4,
    )
    trainer, engine, _ = await grpo_trainer(cfg, reward=LengthReward())
    batches = _record_batches(trainer)
    history = await trainer.run()
    (batch,) = batches
    cut = [s for s in batch if s.cut_off]
    done = [s for s in batch if not s.cut_off]
    assert cut and done, [s.finish_reason for s in batch]
    assert all(s.reward is not None for s in cut)  # judged
    assert all(not s.in_loss and s.left_out == "cut_off" and s.advantage == 0.0 for s in cut)
    assert all(s.in_loss for s in done)
    for gid in {s.group_id for s in batch}:  # each group's baseline is its finished responses'
        group = [s for s in done if s.group_id == gid]
        rewards = [s.reward for s in group]
        if len(set(rewards)) > 1:
            mean = sum(rewards) / len(rewards)
            assert all((s.advantage > 0) == (s.reward > mean) for s in group)
        else:
            assert all(s.advantage == 0.0 for s in group)
    (record,) = read_metrics(cfg.run_dir)
    assert record["rollout/truncated"] == len(cut) and record["rollout/in_loss"] == len(done)
    assert record["train/untrained"] == 0 and "train/untrained_reason" not in record
    assert engine.weight_version == 1 and history[0].untrained is None


class LengthReward:
    """A reward that differs among finished responses: 1.0 for a response of at most 3 tokens."""

    async def __call__(self, args, sample):
        score = 1.0 if sample.response_length <= 3 else 0.0
        return {"score": score, "status": "ok", "gate": "miss", "acc": int(score)}
