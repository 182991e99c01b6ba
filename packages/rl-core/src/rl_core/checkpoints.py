"""Checkpoint folders of ``--save``: their names, their metadata, their size, keeping the last N.

A checkpoint is ``SAVE/step_NNNNNN/`` (written by the training backend, its step and data
position in ``state.json``); ``SAVE/latest`` names the newest one. Reading the metadata needs
neither torch nor the weights, so a resume is checked before anything loads.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

__all__ = [
    "CHECKPOINT_BYTES_PER_PARAM",
    "LATEST",
    "STATE_FILE",
    "checkpoint_path",
    "estimate_checkpoint_bytes",
    "keep_last",
    "read_checkpoint_state",
    "step_folder",
]

#: A checkpoint of the torch backend holds the fp32 weights and Adam's two fp32 moments.
CHECKPOINT_BYTES_PER_PARAM = 12
#: The file in a checkpoint folder that says which step it is (and the data position).
STATE_FILE = "state.json"
#: The file in ``--save`` naming the newest checkpoint.
LATEST = "latest"


def step_folder(root: Path, step: int) -> Path:
    """Where step ``step``'s checkpoint goes."""
    return root / f"step_{step:06d}"


def checkpoint_path(root: Path) -> Path:
    """The checkpoint ``--load root`` means: ``root/<latest>`` in a ``--save`` folder, else
    ``root`` itself."""
    latest = root / LATEST
    return root / latest.read_text().strip() if latest.is_file() else root


def read_checkpoint_state(path: Path) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint folder (step, data position, weight version)."""
    state = json.loads((path / STATE_FILE).read_text())
    if not isinstance(state, dict) or not isinstance(state.get("extra"), dict):
        raise ValueError(f"{STATE_FILE} is not a checkpoint state (no 'extra' object)")
    return state


def keep_last(root: Path, n: int) -> list[Path]:
    """Delete all but the newest ``n`` checkpoints of ``root`` (``--save-keep``); the one
    ``latest`` names is always kept. Returns what was deleted."""
    latest = (root / LATEST).read_text().strip() if (root / LATEST).is_file() else None
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
