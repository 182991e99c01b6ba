"""Whether a path can be the folder a command writes: one rule for ``--save``, ``--save-hf``,
``rl-core export OUT`` and ``rl-core eval --out``, checked before any work starts (a run that
finds an unwritable folder after an hour of training has lost the hour)."""

from __future__ import annotations

import uuid
from pathlib import Path

__all__ = ["folder_problem"]


def folder_problem(
    flag: str,
    path: str | Path,
    *,
    must_be_empty: bool,
    force: bool = False,
    if_not_empty: str = "choose another folder",
    create: bool = False,
) -> str | None:
    """Why ``path`` (given as ``flag``) cannot be written as a folder, or None.

    A folder that holds files is refused when ``must_be_empty`` (unless ``force``), with
    ``if_not_empty`` as the way out. ``create`` makes the folder now and probes a file in it;
    otherwise the probe goes to its parent, which is created if missing (the folder itself is
    made later, e.g. under a temporary name and renamed into place).
    """
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        return f"{flag} {folder}: exists and is not a folder"
    if must_be_empty and not force and folder.is_dir() and any(folder.iterdir()):
        return f"{flag} {folder}: exists and is not empty; {if_not_empty}"
    where = folder if create else folder.absolute().parent
    try:
        where.mkdir(parents=True, exist_ok=True)
        probe = where / f".write-test-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"0")
        probe.unlink()
    except OSError as err:
        which = "" if where == folder else f"{where} is "
        return f"{flag} {folder}: {which}not writable ({err.strerror or err})"
    return None
