"""Checkpoints of a run: their folders, their metadata, their size, keeping the last N, and the
:class:`Checkpointer` that writes and reads them for the GRPO driver.

A checkpoint is ``SAVE/step_NNNNNN/`` (written by the training backend, its step and data
position in ``state.json``); ``SAVE/latest`` names the newest one. Reading the metadata needs
neither torch nor the weights, so a resume is checked before anything loads.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_core.config import TrainConfig
    from rl_core.distributed import Learner

__all__ = [
    "CHECKPOINT_BYTES_PER_PARAM",
    "LATEST",
    "STATE_FILE",
    "CheckpointError",
    "Checkpointer",
    "Resume",
    "checkpoint_path",
    "estimate_checkpoint_bytes",
    "keep_last",
    "latest_step",
    "read_checkpoint_state",
    "step_folder",
]

#: A checkpoint of the torch backend holds the fp32 weights and Adam's two fp32 moments.
CHECKPOINT_BYTES_PER_PARAM = 12
#: The file in a checkpoint folder that says which step it is (and the data position).
STATE_FILE = "state.json"
#: The file in ``--save`` naming the newest checkpoint.
LATEST = "latest"

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; what the step wrote before it (metrics, samples,
    evaluation) is kept."""


def step_folder(root: Path, step: int) -> Path:
    """Where step ``step``'s checkpoint goes."""
    return root / f"step_{step:06d}"


def _latest_name(root: Path) -> str:
    """The folder name ``root/latest`` holds ("" where there is none): its one reader."""
    latest = root / LATEST
    return latest.read_text().strip() if latest.is_file() else ""


def checkpoint_path(root: Path) -> Path:
    """The checkpoint ``--load root`` means: ``root/<latest>`` in a ``--save`` folder, else
    ``root`` itself."""
    return root / _latest_name(root)


def latest_step(root: Path) -> int:
    """The step of the newest checkpoint in the ``--save`` folder ``root`` (0 before the
    first): what a process watching a run from outside polls. ``latest`` is written only once
    its checkpoint is complete."""
    name = _latest_name(root)
    return int(name.removeprefix("step_")) if name.startswith("step_") else 0


def read_checkpoint_state(path: Path) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint folder (step, data position, weight version)."""
    state = json.loads((path / STATE_FILE).read_text())
    if not isinstance(state, dict) or not isinstance(state.get("extra"), dict):
        raise ValueError(f"{STATE_FILE} is not a checkpoint state (no 'extra' object)")
    return state


def keep_last(root: Path, n: int) -> list[Path]:
    """Delete all but the newest ``n`` checkpoints of ``root`` (``--save-keep``); the one
    ``latest`` names is always kept. Returns what was deleted."""
    latest = _latest_name(root)
    steps = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
    doomed = [p for p in steps[: max(len(steps) - n, 0)] if p.name != latest]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def _safetensors_params(path: Path) -> int:
    """Parameters in a safetensors file, from its header (no weights read)."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    total = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        n = 1
        for dim in meta["shape"]:
            n *= int(dim)
        total += n
    return total


def estimate_checkpoint_bytes(model_folder: Path) -> int | None:
    """One checkpoint's size: the policy's parameters (from its safetensors headers) times
    :data:`CHECKPOINT_BYTES_PER_PARAM`; None when the folder holds no safetensors."""
    files = sorted(model_folder.glob("*.safetensors"))
    if not files:
        return None
    return CHECKPOINT_BYTES_PER_PARAM * sum(_safetensors_params(f) for f in files)


@dataclass(frozen=True)
class Resume:
    """What a loaded checkpoint says about the run: where it was, the step it completed, the
    data position and the weight version the engines must then serve."""

    path: Path
    step: int
    cursor: dict[str, Any]
    weight_version: int


class Checkpointer:
    """``--save`` / ``--load`` of a run through its learner: when to save, the save itself (then
    ``latest`` and ``--save-keep``), the resume, what a stopped run saved, and ``--save-hf``."""

    def __init__(self, cfg: TrainConfig, learner: Learner) -> None:
        self.learner = learner
        self.root = Path(cfg.save) if cfg.save else None
        self.load_from = Path(cfg.load) if cfg.load else None
        self.interval = cfg.save_interval
        self.keep = cfg.save_keep
        self.last_step = cfg.num_rollout
        self.run_dir = cfg.run_dir
        #: the run's --hf-checkpoint, recorded so ``rl-core export`` finds the tokenizer
        self.base_model = cfg.hf_checkpoint
        self.save_hf = Path(cfg.save_hf).expanduser() if cfg.save_hf else None
        self.save_hf_dtype = cfg.save_hf_dtype
        #: the step of the newest checkpoint this run wrote or resumed from
        self.saved_step = 0

    def due(self, step: int) -> bool:
        """Whether step ``step`` (1-based) is saved: every ``--save-interval`` and the last."""
        if self.root is None:
            return False
        return bool(self.interval and step % self.interval == 0) or step == self.last_step

    async def save(self, step: int, state: dict[str, Any]) -> Path:
        """Write step ``step``'s checkpoint (``state``: the data position and weight version),
        point ``latest`` at it, then keep the newest ``--save-keep``. Raises
        :class:`CheckpointError` naming the step and the cause."""
        assert self.root is not None, "save without --save"
        root = self.root
        path = step_folder(root, step)
        try:
            extra = {"rollout_step": step, "base_model": self._base_model_record(), **state}
            await self.learner.save(path, extra)
            (root / LATEST).write_text(path.name)
        except OSError as err:
            raise CheckpointError(
                f"saving step {step} to {path} failed: {err}; its metrics, samples and "
                f"evaluation are in {self.run_dir}"
            ) from err
        self.saved_step = step
        if self.keep:
            for gone in await asyncio.to_thread(keep_last, root, self.keep):
                logger.info("removed checkpoint %s (--save-keep %d)", gone, self.keep)
        return path

    def _base_model_record(self) -> str:
        from rl_core.export import base_model_record

        return base_model_record(self.base_model)

    async def load(self) -> Resume | None:
        """The learner's weights and optimizer from ``--load``'s checkpoint, and what it says
        about the run; None without ``--load``."""
        if self.load_from is None:
            return None
        path = checkpoint_path(self.load_from)
        extra = await self.learner.load(path)
        self.saved_step = int(extra["rollout_step"])
        return Resume(path, self.saved_step, extra["cursor"], int(extra["weight_version"]))

    async def save_final_hf(self) -> Path | None:
        """``--save-hf``: the final policy as a Hugging Face model folder (None without it).
        Raises :class:`CheckpointError` naming the folder and the cause."""
        if self.save_hf is None:
            return None
        from rl_core.export import ExportError, check_out_dir

        path = self.save_hf
        try:
            check_out_dir("--save-hf", path)  # checked at start; something may have written since
            await self.learner.save_hf(path, self.save_hf_dtype)
        except (OSError, ExportError) as err:
            raise CheckpointError(
                f"--save-hf {path}: writing the model folder failed: {err}; the run's metrics, "
                f"samples and evaluation are in {self.run_dir}"
            ) from err
        logger.info("wrote the final policy to %s (%s)", path, self.save_hf_dtype)
        return path

    async def save_on_stop(self, where: str, done: int, state: dict[str, Any]) -> str:
        """Save the last completed step ``done`` of a stopped run (unless it is saved already)
        and say, after ``where``, what was saved."""
        if self.root is None:
            return f"{where}: nothing saved (no --save)"
        if done == 0:
            return f"{where}: nothing to save"
        root = self.root
        if done == self.saved_step:
            return f"{where}: checkpoint {step_folder(root, done)} (resume with --load {root})"
        path = await self.save(done, state)
        return f"{where}: saved {path} (resume with --load {root})"
