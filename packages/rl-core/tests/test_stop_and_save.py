"""Stopping, saving and resuming the GRPO driver, in one process (tiny model, test engine).

What a user relies on when a run is preempted or a disk fills: a stop signal mid-step saves the
last completed step and the resumed run continues it exactly; a failed save keeps the step's
metrics and samples; ``--save-keep`` keeps the newest checkpoints; a resume cuts what the run
directory recorded beyond its checkpoint, so no step is logged twice.
"""

import asyncio
import os
import signal

import pytest
from tiny_grpo import ScriptedReward

from rl_core.checkpoints import CheckpointError, latest_step
from rl_core.metrics import read_metrics
from rl_core.stopping import StopRequest


class SignalDuringStep(ScriptedReward):
    """Sends this process ``signum`` while scoring the first sample of step ``step``."""

    def __init__(self, signum, step, per_step=8):
        super().__init__()
        self.signum, self.at, self.sent = signum, (step - 1) * per_step + 1, False

    async def __call__(self, args, sample):
        if self.calls + 1 >= self.at and not self.sent:
            self.sent = True  # once: a second signal means "stop now, without saving"
            os.kill(os.getpid(), self.signum)
            await asyncio.sleep(1.0)  # a judge call in flight when the signal lands
        return await super().__call__(args, sample)


async def test_a_stop_signal_mid_step_saves_the_last_step_and_the_resume_continues(
    tmp_path, grpo_config, grpo_trainer
):
    straight, _, _ = await grpo_trainer(grpo_config(tmp_path / "a", num_rollout=3))
    await straight.run()

    ckpt = tmp_path / "ckpt"
    cfg = grpo_config(tmp_path / "b", num_rollout=3, save=str(ckpt))
    stop = StopRequest()
    stopped, _, _ = await grpo_trainer(
        cfg, reward=SignalDuringStep(signal.SIGTERM, step=2), stop=stop
    )
    stop.install()
    try:
        history = await stopped.run()
    finally:
        stop.uninstall()
    assert [h.step for h in history] == [1]  # step 2 was abandoned in its rollout
    assert stop.exit_code == 143
    assert stopped.stop_report == (
        f"stopped by SIGTERM after step 1 of 3: saved {ckpt / 'step_000001'} "
        f"(resume with --load {ckpt})"
    )
    assert (ckpt / "latest").read_text() == "step_000001"
    assert latest_step(ckpt) == 1  # what a watcher outside the run reads
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [1]

    resumed, _, _ = await grpo_trainer(
        grpo_config(tmp_path / "b", num_rollout=3, save=str(ckpt), load=str(ckpt))
    )
    await resumed.run()
    records = read_metrics(cfg.run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    expected = [h.metrics["rollout/reward_mean"] for h in straight.history]
    assert [r["rollout/reward_mean"] for r in records] == expected
    assert [r["weights/version"] for r in records] == [1, 2, 3]


async def test_a_resume_cuts_what_was_logged_beyond_its_checkpoint(
    tmp_path, grpo_config, grpo_trainer
):
    """--save-interval 2 and a crash after step 3 (before its save): the resume from step 2
    redoes step 3, and metrics and samples read 1, 2, 3, 4 — not 1, 2, 3, 3, 4."""
    ckpt = tmp_path / "ckpt"
    cfg = grpo_config(tmp_path, num_rollout=3, save=str(ckpt), save_interval=2)
    first, _, _ = await grpo_trainer(cfg)
    await first.run()
    # the crash: step 3 was logged but its checkpoint never written
    (ckpt / "step_000003" / "state.json").unlink()
    (ckpt / "step_000003").rename(tmp_path / "lost")
    (ckpt / "latest").write_text("step_000002")

    cfg = grpo_config(tmp_path, num_rollout=4, save=str(ckpt), save_interval=2, load=str(ckpt))
    resumed, _, _ = await grpo_trainer(cfg)
    await resumed.run()
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [1, 2, 3, 4]
    samples = sorted(p.name for p in (tmp_path / "run" / "samples").iterdir())
    assert samples == [f"step_00000{i}.jsonl" for i in (1, 2, 3, 4)]


async def test_a_resume_does_not_evaluate_its_checkpoint_step_again(
    tmp_path, grpo_config, grpo_trainer
):
    """--eval-before-and-after, then a resume from step 2: the resumed run's first evaluation
    used to log a second step-2 record, summarised as "eval before training"."""
    from rich.console import Console

    from rl_core.data import load_prompt_data
    from rl_core.summary import render_summary

    ckpt = tmp_path / "ckpt"
    flags = dict(save=str(ckpt), eval_before_and_after=True, eval_limit=2, eval_interval=2)
    cfg = grpo_config(tmp_path, num_rollout=2, **flags)
    eval_data = load_prompt_data(cfg.prompt_data)
    first, _, _ = await grpo_trainer(cfg, eval_data=eval_data)
    await first.run()
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [0, 1, 2]

    cfg = grpo_config(tmp_path, num_rollout=4, load=str(ckpt), **flags)
    resumed, _, _ = await grpo_trainer(cfg, eval_data=eval_data)
    history = await resumed.run()
    records = read_metrics(cfg.run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]  # step 2 once
    assert [e["step"] for e in resumed.evaluation.history] == [4]
    console = Console(record=True, width=200)
    render_summary(history, mode="colocate", console=console, evals=resumed.evaluation.history)
    text = console.export_text()
    assert "eval before training" not in text and "eval after step 4" in text


async def test_a_failed_save_keeps_the_steps_metrics_and_samples(
    tmp_path, grpo_config, grpo_trainer
):
    ckpt = tmp_path / "ckpt"
    cfg = grpo_config(tmp_path, num_rollout=1, save=str(ckpt))
    ckpt.write_text("a file where the checkpoint folder should go")  # the save will fail
    trainer, _, _ = await grpo_trainer(cfg)
    with pytest.raises(CheckpointError, match=r"saving step 1 to .*step_000001 failed"):
        await trainer.run()
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [1]
    assert (tmp_path / "run" / "samples" / "step_000001.jsonl").is_file()


async def test_save_keep_keeps_the_newest_checkpoints(tmp_path, grpo_config, grpo_trainer):
    ckpt = tmp_path / "ckpt"
    cfg = grpo_config(tmp_path, num_rollout=3, save=str(ckpt), save_interval=1, save_keep=2)
    trainer, _, _ = await grpo_trainer(cfg)
    assert latest_step(ckpt) == 0  # nothing saved yet
    await trainer.run()
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert (ckpt / "latest").read_text() == "step_000003"
    assert latest_step(ckpt) == 3
