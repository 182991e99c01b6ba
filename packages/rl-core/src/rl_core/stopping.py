"""SIGTERM and SIGINT on the driver: a preemption or a Ctrl-C stops the run cleanly.

Ray's driver installs its own SIGTERM handler (a C++ stack dump and exit 134) and Python turns
SIGINT into a traceback; either way nothing was saved and Ray's processes were left behind.
:class:`StopRequest` takes both signals over once Ray is up. While the training loop runs, the
first signal asks it to stop at the next safe point (the step in rollout is abandoned, a step
that is training is finished) and to save the last completed step; before the loop (start-up)
or on a second signal, the run is cancelled at once. Either way the exit stack stops Serve and
Ray, and the exit status is the shell's ``128 + signal`` (143 / 130).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["STOP_SIGNALS", "StopRequest"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: The signals a scheduler's preemption (SIGTERM) and a user's Ctrl-C (SIGINT) send.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Which stop signal arrived (if any), and the run's reaction to it."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.event = asyncio.Event()
        #: The training loop runs: a signal lets it stop at a safe point instead of cancelling.
        self.graceful = False
        #: What was saved, in one line, once the run stopped.
        self.report: str | None = None
        #: Stop signals received (a second one stops at once).
        self.count = 0
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "no signal"

    @property
    def exit_code(self) -> int:
        """The shell's status of a process ended by that signal: 143 (SIGTERM), 130 (SIGINT)."""
        return 128 + (self.signum if self.signum is not None else signal.SIGINT)

    def install(self) -> None:
        """Handle the stop signals on the running loop, for the task running this call (call it
        after ``ray.init``, which installs handlers of its own)."""
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for sig in STOP_SIGNALS:
            self._loop.add_signal_handler(sig, self._received, sig)

    def abrupt(self) -> None:
        """From now on a signal cancels the run at once: the loop is over (or failed), nothing
        is left to save."""
        self.graceful = False

    def uninstall(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for sig in STOP_SIGNALS:
                self._loop.remove_signal_handler(sig)
        self._loop = None

    def _received(self, signum: int) -> None:
        self.count += 1
        first = self.signum is None
        if first:
            self.signum = signum
            self.event.set()
        if first and self.graceful:
            logger.warning(
                "%s: stopping at the next safe point and saving the last completed step "
                "(again to stop at once, without saving)",
                signal.Signals(signum).name,
            )
            return
        if self._task is not None:
            self._task.cancel()

    async def wait(self) -> None:
        await self.event.wait()

    async def unless_stopped(self, work: Awaitable[T]) -> T | None:
        """``work``'s result, or None when a stop signal came first (``work`` is cancelled:
        nothing of it is kept, e.g. a rollout the resume redoes)."""
        task = asyncio.ensure_future(work)
        waiter = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        return None if task.cancelled() else task.result()
