"""A run that lost a trainer rank restarts from its last checkpoint (``rl_core.restarts``), and
every step is still recorded once: the decision, the driver's loop, and the run directory's
records (``metrics.jsonl``, ``samples/``, TensorBoard) over a restart. No Ray, no model."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import RayActorError
from run_records import tb_scalars

from rl_core.metrics import MetricsWriter, read_metrics
from rl_core.restarts import Restart, RunLostError, decide_restart, restarted_config

_KILLED = """The actor died unexpectedly before finishing this task.
\tclass_name: TrainWorker
\tactor_id: 0a1b
\tpid: 4242
\tname: rl-core-1f2e3d:actor-1
\tnamespace: 9c8b
\tip: 10.0.0.7
The actor is dead because it was killed by `ray.kill`."""


def _lost() -> RayActorError:
    return RayActorError(error_msg=_KILLED)


def _checkpoint(save: Path, step: int) -> Path:
    folder = save / f"step_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    extra = {"rollout_step": step, "cursor": {}, "weight_version": step}
    (folder / "state.json").write_text(json.dumps({"step": step, "extra": extra}))
    (save / "latest").write_text(folder.name)
    return folder


# --- the decision ---------------------------------------------------------------------------------


def test_a_lost_rank_restarts_from_the_newest_checkpoint_of_save(tmp_path, grpo_config):
    save = tmp_path / "ckpt"
    _checkpoint(save, 1)
    _checkpoint(save, 2)
    cfg = grpo_config(tmp_path, num_rollout=4, save=str(save), save_interval=1, max_restarts=2)
    decided = decide_restart(cfg, TimeoutError("a deadline"), 0)
    assert decided is None  # not a lost process: not ours
    try:
        raise TimeoutError("train did not finish") from _lost()
    except TimeoutError as err:
        decided = decide_restart(cfg, err, 0)
    assert isinstance(decided, Restart)
    assert (decided.number, decided.step, decided.source) == (1, 2, save)
    assert decided.lost.startswith("lost trainer rank actor-1 (pid 4242, ip 10.0.0.7): ")
    line = decided.line(cfg.max_restarts)
    assert "from its checkpoint of step 2 (" in line and str(save / "step_000002") in line
    assert line.endswith("restart 1 of --max-restarts 2")
    again = restarted_config(cfg, decided)
    assert again.load == str(save) and again.save == cfg.save and cfg.load is None


@pytest.mark.parametrize(
    ("used", "max_restarts", "stopping", "says"),
    [
        (2, 2, False, "no restart left (2 of --max-restarts 2 used)"),
        (0, 0, False, "no restart (--max-restarts 0)"),
        (0, 3, True, "a stop signal came, no restart"),
    ],
    ids=["used-up", "zero", "stopping"],
)
def test_no_restart_says_why(tmp_path, grpo_config, used, max_restarts, stopping, says):
    save = tmp_path / "ckpt"
    _checkpoint(save, 1)
    cfg = grpo_config(tmp_path, save=str(save), max_restarts=max_restarts)
    assert decide_restart(cfg, _lost(), used, stopping=stopping) == says


def test_without_save_or_a_checkpoint_the_one_line_says_it(tmp_path, grpo_config):
    assert decide_restart(grpo_config(tmp_path), _lost(), 0) is None  # no --save
    cfg = grpo_config(tmp_path, save=str(tmp_path / "empty"))
    assert decide_restart(cfg, _lost(), 0) is None  # nothing written yet


def test_before_its_first_checkpoint_a_loaded_run_restarts_from_its_load(tmp_path, grpo_config):
    old = tmp_path / "old"
    _checkpoint(old, 3)
    cfg = grpo_config(tmp_path, num_rollout=6, save=str(tmp_path / "new"), load=str(old))
    decided = decide_restart(cfg, _lost(), 0)
    assert isinstance(decided, Restart) and (decided.source, decided.step) == (old, 3)


def test_the_default_restarts_three_times() -> None:
    from rl_core.config import TrainConfig

    assert TrainConfig.model_fields["max_restarts"].default == 3


def test_the_last_line_says_why_there_was_no_restart(tmp_path: Path) -> None:
    from rl_core.lost import lost_process_line

    save = tmp_path / "ckpt"
    _checkpoint(save, 2)
    note = "no restart left (3 of --max-restarts 3 used)"
    line = lost_process_line(_lost(), ["--save", str(save)], str(save), note)
    assert line.startswith("lost trainer rank actor-1 (pid 4242, ip 10.0.0.7): ")
    assert f"ray.kill`.; {note}; resume from the last checkpoint with: " in line
    assert line.endswith(f"--load {save}")


# --- a failed call to the ranks names the rank that died ------------------------------------------


async def test_a_failed_call_raises_the_dead_ranks_error_not_the_survivors() -> None:
    """Rank 0's collective lost its peer and failed first; rank 1 died (Ray says so a moment
    later); rank 2 is still stuck in its collective. The call raises rank 1's error, which the
    restart is decided on, raised from rank 0's."""
    from rl_core.distributed import TrainGroup

    loop = asyncio.get_running_loop()
    survivor, dead, stuck = loop.create_future(), loop.create_future(), loop.create_future()
    survivor.set_exception(RuntimeError("gloo: Connection closed by peer"))
    loop.call_later(0.05, dead.set_exception, _lost())
    group = object.__new__(TrainGroup)
    group.role = "actor"
    with pytest.raises(RayActorError) as raised:
        await group._wait("train", [survivor, dead, stuck], 60.0)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert stuck.cancelled()


async def test_a_failed_call_without_a_dead_rank_raises_its_own_error() -> None:
    from rl_core.distributed import TrainGroup

    loop = asyncio.get_running_loop()
    failed, done = loop.create_future(), loop.create_future()
    failed.set_exception(ValueError("a bad batch"))
    done.set_result({})
    group = object.__new__(TrainGroup)
    group.role = "actor"
    with pytest.raises(ValueError, match="a bad batch"):
        await group._wait("train", [failed, done], 60.0)


# --- the driver's loop ----------------------------------------------------------------------------


class _FakeTrainer:
    stop_report = None


class _FakeLearner:
    precision = None


async def test_the_driver_restarts_on_the_same_ray_until_none_is_left(
    tmp_path, grpo_config, monkeypatch, caplog
):
    """``run_training``'s loop, its parts replaced: Ray is connected once; each go after a lost
    rank loads ``--save``; the records of the steps redone are forgotten; past
    ``--max-restarts`` the error is :class:`RunLostError`, raised from Ray's."""
    from rl_core import launch
    from rl_core.trainer import StepRecord

    save = tmp_path / "ckpt"
    cfg = grpo_config(tmp_path, num_rollout=5, save=str(save), save_interval=1, max_restarts=2)
    connects: list[int] = []
    goes: list[Any] = []

    async def train_once(attempt, run):
        record = run.record
        goes.append((attempt.load, [h.step for h in record.history], len(record.restarts)))
        step = len(goes) + 1  # each go gets one step further before its rank is lost
        record.history[:] = [StepRecord(s, {}, {}) for s in range(1, step + 1)]
        record.evals.append({"step": step})
        if len(goes) <= 3:
            _checkpoint(save, step - 1)
            raise RuntimeError("a step failed") from _lost()
        return _FakeTrainer(), _FakeLearner()

    monkeypatch.setattr(launch, "connect_ray", lambda *a: connects.append(1))
    monkeypatch.setattr(launch, "_train_once", train_once)
    monkeypatch.setattr(launch, "resolve_rollout_engine", lambda c: "hf")
    caplog.set_level(logging.WARNING, logger="rl_core.launch")
    with pytest.raises(RunLostError) as raised:
        await launch.run_training(cfg)
    assert connects == [1]
    assert goes == [
        (None, [], 0),
        (str(save), [1], 1),  # the first go reached step 2, its checkpoint was step 1
        (str(save), [1, 2], 2),
    ]
    assert raised.value.note == "no restart left (2 of --max-restarts 2 used)"
    assert isinstance(raised.value.__cause__, RuntimeError)
    restarts = [r.getMessage() for r in caplog.records if "restarting the run" in r.message]
    assert len(restarts) == 2 and "restart 2 of --max-restarts 2" in restarts[1]


async def test_a_restart_the_cluster_cannot_hold_again_ends_on_the_lost_process(
    tmp_path, grpo_config, monkeypatch
):
    """A node lost for good: the restart asks for the first placement's kind of bundles (the
    cluster may have no GPU left to tell), its placement wait gives up after
    ``--restart-wait-s``, and the run ends with :class:`RunLostError` raised from Ray's error
    for the lost process (its last line names that process), saying why there was no restart."""
    from rl_core import launch
    from rl_core.placement import PlacementUnavailableError

    save = tmp_path / "ckpt"
    cfg = grpo_config(tmp_path, num_rollout=3, save=str(save), save_interval=1)
    lost = _lost()
    seen: list[Any] = []

    async def train_once(attempt, run):
        record = run.record
        seen.append(record.use_gpus)
        if record.use_gpus is None:  # the first go: placed on GPUs, then a node is lost
            record.use_gpus = True
            _checkpoint(save, 1)
            raise RuntimeError("a step failed") from lost
        raise PlacementUnavailableError('placement group "actor" not placed after 5 s')

    monkeypatch.setattr(launch, "connect_ray", lambda *a: None)
    monkeypatch.setattr(launch, "_train_once", train_once)
    monkeypatch.setattr(launch, "resolve_rollout_engine", lambda c: "hf")
    with pytest.raises(RunLostError) as raised:
        await launch.run_training(cfg)
    assert seen == [None, True]
    assert raised.value.note == 'no restart: placement group "actor" not placed after 5 s'
    from rl_core.lost import lost_actor_error

    assert lost_actor_error(raised.value) is lost


def test_a_restart_waits_as_long_as_restart_wait_s(grpo_config, tmp_path):
    from rl_core.limits import PLACEMENT_TIMEOUT_S

    assert grpo_config(tmp_path).restart_wait_s == PLACEMENT_TIMEOUT_S
    with pytest.raises(ValueError, match="--restart-wait-s = 0: Input should be greater than 0"):
        grpo_config(tmp_path, restart_wait_s=0)


# --- the records: each step once ------------------------------------------------------------------


def test_a_restart_records_every_step_once_in_metrics_samples_and_tensorboard(tmp_path):
    """Steps 1-3 logged (step 3's checkpoint never written), the rank lost; the restart from
    step 2's checkpoint logs 3 and 4 again with a writer of its own, as the driver does."""
    first = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        first.log(step, {"rollout/reward_mean": float(step), "run/restarts": 0})
        first.log_samples(f"step_{step:06d}", [{"step": step, "go": 1}])
    first.close()  # the driver's exit stack closes it as the failed go unwinds

    again = MetricsWriter(tmp_path)
    assert again.truncate(2) == 1  # what the resume does first (GRPOTrainer.resume)
    for step in (3, 4):
        again.log(step, {"rollout/reward_mean": 10.0 + step, "run/restarts": 1})
        again.log_samples(f"step_{step:06d}", [{"step": step, "go": 2}])
    again.close()

    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["rollout/reward_mean"] for r in records] == [1.0, 2.0, 13.0, 14.0]
    samples = sorted((tmp_path / "samples").glob("step_*.jsonl"))
    assert [p.stem for p in samples] == [f"step_00000{i}" for i in (1, 2, 3, 4)]
    goes = [json.loads(p.read_text())["go"] for p in samples]
    assert goes == [1, 1, 2, 2]
    for purge in (True, False):  # TensorBoard, and a reader that knows no purge rule
        scalars = tb_scalars(tmp_path / "tb", purge=purge)
        assert scalars["rollout/reward_mean"] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
        assert [s for s, _ in scalars["run/restarts"]] == [1, 2, 3, 4]


def test_an_event_file_cut_short_by_a_crash_keeps_its_whole_records(tmp_path):
    """The crash that made this a restart may have cut the last record of an event file: the
    cut keeps every whole record up to it, and TensorBoard reads the file again."""
    from rl_core.metrics import cut_tensorboard

    first = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        first.log(step, {"x": float(step)})
    first.close()
    (path,) = (tmp_path / "tb").glob("*tfevents*")
    path.write_bytes(path.read_bytes()[:-7])  # step 3's record, cut short
    assert cut_tensorboard(tmp_path / "tb", 1) == 1  # step 2's; step 3's was not whole
    assert tb_scalars(tmp_path / "tb", purge=False)["x"] == [(1, 1.0)]


def test_a_restart_from_the_step_it_lost_cuts_nothing(tmp_path):
    """The rank lost after step 2 was saved: nothing beyond the checkpoint to cut."""
    first = MetricsWriter(tmp_path)
    for step in (1, 2):
        first.log(step, {"x": float(step)})
    first.close()
    again = MetricsWriter(tmp_path)
    assert again.truncate(2) == 0
    again.log(3, {"x": 3.0})
    again.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert tb_scalars(tmp_path / "tb", purge=False)["x"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
