"""Where a CPU engine keeps its updated weights while it sleeps: a folder under the temp dir.

On CPU, sleeping drops the model to give its memory to the trainer; weights a trainer sent
since the load exist nowhere else, so they are saved first (``save_pretrained``, 512 MB for the
embedded model in fp32) and read back at wake.

The folder goes with the engine's ``shutdown`` or its process's exit (``atexit``: the end of a
run's placement groups ends their actors that way), but not with a process killed outright
(``ray.kill``, the OOM killer, a lost node). Those left one copy per CPU engine in the temp dir,
so the folder is named for the host and process that own it, and every engine that starts
removes the folders of this host's processes that are gone. The host is in the name because a
temp dir may be shared by machines (or containers) whose process ids mean different processes.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "genrm-hf-weights-"


def _host() -> str:
    """This host's name as it can sit in a folder name (no separators)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Remove the snapshot folders of this host's processes that no longer run. The removed."""
    root = Path(root or tempfile.gettempdir())
    pattern = re.compile(rf"{re.escape(PREFIX)}{re.escape(_host())}-(\d+)-")
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if m is None or _alive(int(m.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    if removed:
        logger.info("removed %d weight snapshot(s) of engines that are gone", len(removed))
    return removed


class WeightSnapshot:
    """One engine's snapshot folder: made at its first use, removed at shutdown or exit."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root
        self.path: Path | None = None

    def folder(self) -> Path:
        """The folder to save into (made the first time)."""
        if self.path is None:
            prefix = f"{PREFIX}{_host()}-{os.getpid()}-"
            self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root))
            atexit.register(self.remove)
        return self.path

    def remove(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            atexit.unregister(self.remove)
            self.path = None
