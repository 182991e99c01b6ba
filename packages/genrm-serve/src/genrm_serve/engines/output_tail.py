"""The last lines an engine's child processes wrote to stderr, kept for its error messages.

SGLang's scheduler runs in a child process (multiprocessing, spawn). When it fails while the
model loads (an OOM, a config it refuses, an incompatible kernel), its traceback goes to the
stderr it inherited and the parent only learns "Rank 0 scheduler died during initialization":
the reason is in a log file of a Ray worker, or scrolled away. So while the engine starts, this
process's fd 2 is a pipe that a thread passes on to the real stderr and keeps the tail of. The
children inherit the pipe and keep writing into it for their whole life (a later crash's
traceback is kept too); the parent's own fd 2 is put back as soon as the engine is up.
"""

from __future__ import annotations

import collections
import os
import threading
import time

__all__ = ["OutputTail"]

#: Lines kept (a Python traceback with SGLang's frames fits).
TAIL_LINES = 60


class OutputTail:
    """A tee of fd 2; :meth:`install` starts it, :meth:`release_parent` gives the parent its
    stderr back (the children keep the pipe)."""

    def __init__(self, lines: int = TAIL_LINES) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._partial = b""
        self._lock = threading.Lock()
        self._forward = -1
        self._installed = False

    @classmethod
    def install(cls, lines: int = TAIL_LINES) -> OutputTail:
        tail = cls(lines)
        read_end, write_end = os.pipe()
        tail._forward = os.dup(2)
        os.dup2(write_end, 2)
        os.close(write_end)
        tail._installed = True
        threading.Thread(
            target=tail._pump, args=(read_end,), name="stderr-tail", daemon=True
        ).start()
        return tail

    def release_parent(self) -> None:
        """This process's fd 2 is the real stderr again (children still write into the tail)."""
        if self._installed:
            os.dup2(self._forward, 2)
            self._installed = False

    def _pump(self, read_end: int) -> None:
        try:
            while chunk := os.read(read_end, 65536):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self._forward, view) :]
                self._keep(chunk)
        except OSError:
            pass
        finally:
            os.close(read_end)
            os.close(self._forward)

    def _keep(self, chunk: bytes) -> None:
        with self._lock:
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            for line in lines:
                self._lines.append(line.decode(errors="replace").rstrip())

    def lines(self) -> list[str]:
        with self._lock:
            tail = list(self._lines)
            if self._partial:
                tail.append(self._partial.decode(errors="replace").rstrip())
        return [line for line in tail if line]

    def describe(self, settle_s: float = 0.0) -> str:
        """The kept lines as a paragraph of an error message ('' when there are none).

        ``settle_s``: a dying child writes its traceback just before it exits; give the pump
        that long to read it.
        """
        if settle_s:
            time.sleep(settle_s)
        lines = self.lines()
        if not lines:
            return ""
        return f"\n--- the last {len(lines)} lines SGLang wrote to stderr ---\n" + "\n".join(lines)
