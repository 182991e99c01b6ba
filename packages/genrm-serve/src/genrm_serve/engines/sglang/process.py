"""The processes and threads around ``sgl.Engine``: the one thread that owns it, SIGQUIT from
its children, the children themselves (watched, and reaped at shutdown), and what they wrote to
stderr.

Threading. ``sgl.Engine.__init__`` adopts the running event loop of its thread or makes one
(``entrypoints/engine.py: Engine.__init__``), its sync methods drive that loop with
``run_until_complete`` (which fails inside a running loop, e.g. a Ray actor's), and
``async_generate`` must run on that same loop (``managers/tokenizer_manager.py`` binds its
response loop to it). So one private thread owns the engine and its loop (:class:`EngineThread`):
the loop runs forever and takes every ``async_generate`` concurrently, so SGLang's continuous
batching sees every request in flight, of every batch the worker in front has sent (it runs a
continuous engine's batches concurrently, ``engines/worker.py``); a sync control call (flush,
release, resume, weight updates, server info) stops the loop, runs on the thread, then the loop
resumes.

Children. A failing SGLang child sends SIGQUIT to its parent (``scheduler.py:
run_scheduler_process``; a hung forward does too, ``utils/watchdog.py: ProcessWatchdog``; and
SGLang's ``SubprocessWatchdog`` SIGQUITs this process when a child dies), whose default action
kills the actor silently; SGLang installs its own handler only on the main thread.
:func:`install_sigquit_guard` installs one (main thread: it reports the failure; elsewhere, e.g. a
Ray async actor where ``signal.signal`` refuses, SIGQUIT is ignored and :func:`dead_child`, polled
by the engine, reports the dead child instead). :func:`shutdown_own_processes` ends one engine's
processes where several engines share this process.

Stderr (:class:`OutputTail`). SGLang's scheduler runs in a child process (multiprocessing, spawn).
When it fails while the model loads (an OOM, a config it refuses, an incompatible kernel), its
traceback goes to the stderr it inherited and the parent only learns "Rank 0 scheduler died during
initialization": the reason is in a log file of a Ray worker, or scrolled away. So while the
engine starts, this process's fd 2 is a pipe that a thread passes on to the real stderr and keeps
the tail of. The children inherit the pipe and keep writing into it for their whole life (a later
crash's traceback is kept too); the parent's own fd 2 is put back as soon as the engine is up.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import ctypes
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from genrm_serve import limits

__all__ = [
    "EngineThread",
    "OutputTail",
    "dead_child",
    "ignore_sigquit_process_wide",
    "install_sigquit_guard",
    "restore_sigquit",
    "shutdown_own_processes",
]

T = TypeVar("T")


def ignore_sigquit_process_wide() -> None:
    """SIG_IGN for SIGQUIT through libc: ``signal.signal`` refuses off the main thread."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.signal(int(signal.SIGQUIT), 1)  # SIG_IGN == 1 on Linux


class EngineThread:
    """One thread that owns ``sgl.Engine`` and runs its event loop (the module docstring:
    Threading)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.engine: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._ready: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._thread: threading.Thread | None = None
        self._stopping = False

    def start(self, build: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        self._thread = threading.Thread(target=self._main, args=(build,), name=self.name)
        self._thread.daemon = True
        self._thread.start()
        return self._ready

    def _main(self, build: Callable[[], Any]) -> None:
        try:
            engine = build()  # outside any running loop, as a script would build it
            loop = getattr(engine, "loop", None)
            if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed():
                loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.engine, self.loop = engine, loop
        except BaseException as err:
            self._ready.set_exception(err)
            return
        self._ready.set_result(engine)
        while not self._stopping:
            loop.run_forever()  # returns when a sync job (or stop) asks for the thread
            while True:
                try:
                    fn, fut = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as err:
                        fut.set_exception(err)

    def call(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run a sync engine method on the thread while the loop is stopped."""
        assert self.loop is not None
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        self.loop.call_soon_threadsafe(self.loop.stop)
        return asyncio.wrap_future(fut)

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        """Schedule a coroutine of the engine on its loop."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self._stopping = True
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)


def install_sigquit_guard(on_sigquit: Callable[[str], None]) -> Any:
    """SIGQUIT from an SGLang child calls ``on_sigquit(why)`` (main thread) or is ignored
    (any other thread: the child's death is then seen by :func:`dead_child`). Returns the handler
    it replaced, for :func:`restore_sigquit` (``None`` off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        ignore_sigquit_process_wide()
        return None

    def handler(signum: int, frame: Any) -> None:
        on_sigquit("an SGLang child process failed (it sent SIGQUIT to this process)")

    return signal.signal(signal.SIGQUIT, handler)


def restore_sigquit(previous: Any) -> None:
    """Put back the handler :func:`install_sigquit_guard` replaced (main thread only)."""
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGQUIT, previous)


def dead_child(children: Iterable[Any]) -> str | None:
    """Why the engine failed, if one of its child processes has exited (``None``: all alive)."""
    for proc in children:
        if not proc.is_alive():
            return f"SGLang child {proc.name} (pid {proc.pid}) exited {proc.exitcode}"
    return None


def shutdown_own_processes(sgl: Any, mine: list[Any]) -> None:
    """``sgl.Engine.shutdown`` for one engine of several in a process. SGLang's ends with
    ``kill_process_tree(os.getpid())`` (entrypoints/engine.py, seen on 0.5.17): every child of
    the process, another engine's scheduler and detokenizer included, which that engine then
    reports as crashed. This does its steps for this engine's own processes (and theirs)."""
    import psutil

    manager = getattr(sgl, "tokenizer_manager", None)
    watchdog = getattr(manager, "_subprocess_watchdog", None)
    if watchdog is not None:
        watchdog.stop()
    rpc = getattr(sgl, "send_to_rpc", None)
    if rpc is not None:
        rpc.close(linger=0)
        sgl.send_to_rpc = None
    procs: list[Any] = []
    for child in mine:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc = psutil.Process(child.pid)
            procs += [*proc.children(recursive=True), proc]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=limits.SGLANG_SHUTDOWN_REAP_S)


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
