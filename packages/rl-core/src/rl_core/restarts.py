"""Restarting a run from its last checkpoint after it lost a process it cannot re-create in place
(a trainer rank: its ``torch.distributed`` group dies with it), up to ``--max-restarts`` times.

A lost rollout or judge engine is re-created where it was (``rl_core.engine_recovery``, the
judge service); a lost trainer rank is not: the surviving ranks hold a process group with a
hole, and the optimizer state exists only in the checkpoint. So, as Ray Train's
``FailureConfig(max_failures=N)`` does, the driver tears down what the run stands on (its
placement groups, and with them every actor; the judge service), builds it again on the Ray that
is still up, and goes on from the checkpoint as ``--load`` does: the records beyond the
checkpoint's step (``metrics.jsonl``, ``samples/``, TensorBoard) are cut before the redone steps
are written again (:meth:`rl_core.metrics.MetricsWriter.truncate`), so every step is recorded
once.

This module decides (pure, no Ray): is this error a lost process, is a restart left, which
checkpoint does it go on from, and what the run says about it. ``rl_core.launch`` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rl_core.checkpoints import LATEST, checkpoint_path, read_checkpoint_state
from rl_core.lost import lost_actor_error, lost_process_what

if TYPE_CHECKING:
    from rl_core.config import TrainConfig

__all__ = ["Restart", "RunLostError", "decide_restart", "restart_source", "restarted_config"]


@dataclass(frozen=True)
class Restart:
    """One restart of the run: what was lost, and the checkpoint the run goes on from."""

    #: 1-based: the run's first restart is 1
    number: int
    #: the lost process and Ray's cause, as ``rl_core.lost`` words it
    lost: str
    #: the checkpoint folder the restart loads (a ``--save`` folder, or a ``step_*`` one)
    source: Path
    #: the step that checkpoint completed: the restarted run records steps after it
    step: int

    def line(self, max_restarts: int) -> str:
        """The log line of the restart (what was lost, from where the run goes on)."""
        return (
            f"{self.lost}; restarting the run from its checkpoint of step {self.step} "
            f"({checkpoint_path(self.source)}): restart {self.number} of --max-restarts "
            f"{max_restarts}"
        )

    def note(self) -> str:
        """The restart in the closing summary."""
        return (
            f"restart {self.number}: {self.lost}; went on from its checkpoint of step {self.step}"
        )


class RunLostError(RuntimeError):
    """A lost process ended the run: no restart was possible (``note`` says why). Raised from
    Ray's error, so ``rl_core.lost`` still finds it for the run's last line."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


def restart_source(cfg: TrainConfig) -> Path | None:
    """The checkpoint a restart goes on from: the newest of ``--save``; before this run wrote
    one, the ``--load`` it started from; else None (nothing to restart from)."""
    if cfg.save and (Path(cfg.save) / LATEST).is_file():
        return Path(cfg.save)
    return Path(cfg.load) if cfg.load else None


def decide_restart(
    cfg: TrainConfig, err: BaseException, used: int, *, stopping: bool = False
) -> Restart | str | None:
    """What to do about ``err``, which ended a run that had restarted ``used`` times.

    A :class:`Restart` when the run goes on; a reason when a lost process ends it (a stop
    signal came, no restart left, an unreadable checkpoint); None when ``err`` is not a lost
    process, or the run's last line says enough by itself (no --save, no checkpoint yet).
    """
    lost = lost_actor_error(err)
    if lost is None:
        return None
    if stopping:
        return "a stop signal came, no restart"
    if not cfg.save:
        return None  # the one line says: the run had no --save
    if used >= cfg.max_restarts:
        if cfg.max_restarts == 0:
            return "no restart (--max-restarts 0)"
        return f"no restart left ({used} of --max-restarts {cfg.max_restarts} used)"
    source = restart_source(cfg)
    if source is None:
        return None  # the one line says: no checkpoint was written yet
    try:
        state = read_checkpoint_state(checkpoint_path(source))
        step = int(state["extra"]["rollout_step"])
    except (OSError, ValueError, KeyError, TypeError) as bad:
        return f"no restart: the checkpoint {checkpoint_path(source)} is unreadable ({bad})"
    return Restart(used + 1, lost_process_what(lost, err), source, step)


def restarted_config(cfg: TrainConfig, restart: Restart) -> TrainConfig:
    """The run's config for a restart: the same run, loading the restart's checkpoint."""
    return cfg.model_copy(update={"load": str(restart.source)})
