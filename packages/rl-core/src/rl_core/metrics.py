"""Per-step metrics to a JSONL file and TensorBoard, a rich progress line per phase, GPU memory.

The JSONL file (``RUN_DIR/metrics.jsonl``, one object per step, flat ``section/name`` keys) is the
record ``rl-core plot``, ``rl-core show`` and tests read; TensorBoard (``RUN_DIR/tb``) is for
people, and so is a :class:`RunMirror` such as W&B (``--use-wandb``, ``rl_core.wandb_mirror``),
which is handed each record and each step's samples as they were written to the files, so every
view shows what the run's files hold. Every phase's
seconds, of start-up and of each step, come from :class:`PhaseClock`, so "time per phase" in the
metrics and the summary are the same numbers the progress display showed. :class:`GpuMemoryProbe`
reads the memory every GPU of the run uses, for the step's ``mem/`` metrics.
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rl_core.limits import ENGINE_PROBE_TIMEOUT_S
from rl_core.terminal import make_console

if TYPE_CHECKING:
    from genrm_serve import RemoteEngine
    from rl_core.engine_recovery import RecoverableEngine

METRICS_FILE = "metrics.jsonl"

#: Reads GPU memory now: ``{gpu: used GB}`` for every GPU of the run (:class:`GpuMemoryProbe`).
MemoryProbe = Callable[[], Awaitable[dict[str, float]]]
#: Where a phase's seconds land: ``{phase: seconds}`` (one per step, or the run's start-up).
PhaseTimes = dict[str, float]


class RunMirror(Protocol):
    """Another view of the run's records (W&B): handed what was just written to the files."""

    def log(self, step: int, record: dict[str, Any]) -> None:
        """One line of ``metrics.jsonl`` (``step`` and ``time`` included)."""

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """The rows of ``samples/step_N.jsonl``."""


class MetricsWriter:
    """Appends one JSON object per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard
    (and every record to ``mirror``, when the run has one)."""

    def __init__(
        self, run_dir: str | Path, *, tensorboard: bool = True, mirror: RunMirror | None = None
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self.mirror = mirror
        self._tb: Any = self._tensorboard() if tensorboard else None

    def _tensorboard(self, purge_step: int | None = None) -> Any:
        """A TensorBoard writer of its own event file. tensorboardX names the file by the
        second (and host) and opens it for writing: a second writer in the same second (a
        resume's purge, a restarted run) would empty the first one's. The nanosecond suffix
        keeps both, in the order TensorBoard reads them (by name)."""
        from tensorboardX import SummaryWriter

        return SummaryWriter(
            str(self.run_dir / "tb"), purge_step=purge_step, filename_suffix=f".{time.time_ns()}"
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        line = json.dumps(record, default=str)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                numeric = isinstance(value, int | float) and not isinstance(value, bool)
                if numeric and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self.mirror is not None:
            self.mirror.log(step, json.loads(line))  # the record as the file holds it

    def log_samples(
        self, name: str, rows: list[dict[str, Any]], *, step: int | None = None
    ) -> None:
        """Write one step's samples (question, response, reward, verdict source, ...) to
        ``RUN_DIR/samples/<name>.jsonl``: what the policy said and what the judge made of it.
        With ``step``, the mirror gets them too (as a table)."""
        folder = self.run_dir / "samples"
        folder.mkdir(exist_ok=True)
        lines = [json.dumps(row, default=str) for row in rows]
        with (folder / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
        if self.mirror is not None and step is not None:
            self.mirror.log_samples(step, [json.loads(line) for line in lines])

    def log_watch(self, step: int, examples: dict[str, Any]) -> None:
        """The reward-hacking watch's examples of a step, to ``RUN_DIR/watch.jsonl``."""
        from rl_core.watch import write_watch

        write_watch(self.run_dir, step, examples)

    def has_step(self, step: int) -> bool:
        """Whether ``metrics.jsonl`` holds a record of ``step`` (a resume's checkpoint step was
        logged by the run that saved it: evaluating it again would log it twice)."""
        return step in logged_steps(self.run_dir)

    def truncate(self, step: int) -> int:
        """Forget every step after ``step`` (a resume from its checkpoint redoes them): the
        records of ``metrics.jsonl`` and of the watch's ``watch.jsonl``, the sample files, and
        TensorBoard's events (a writer with ``purge_step`` tells TensorBoard to drop them, and
        they are cut from the event files too: :func:`cut_tensorboard`). Returns the records of
        ``metrics.jsonl`` removed."""
        from rl_core.watch import WATCH_FILE

        removed = _truncate_jsonl(self.path, step)
        _truncate_jsonl(self.run_dir / WATCH_FILE, step)
        for f in (self.run_dir / "samples").glob("step_*.jsonl"):
            number = f.stem.removeprefix("step_")
            if number.isdigit() and int(number) > step:
                f.unlink()
        if self._tb is not None:
            self._tb.close()
            cut_tensorboard(self.run_dir / "tb", step)
            self._tb = self._tensorboard(purge_step=step + 1)
        return removed

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _truncate_jsonl(path: Path, step: int) -> int:
    """Keep the lines of ``path`` whose ``step`` is at most ``step``; returns the lines removed
    (a line cut short by the crash that made this a resume is one of them)."""
    if not path.is_file():
        return 0
    removed = 0
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            removed += 1
            continue
        if int(record.get("step", 0)) <= step:
            kept.append(line)
        else:
            removed += 1
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
    return removed


def cut_tensorboard(folder: Path, step: int) -> int:
    """Remove the scalars of the steps after ``step`` from the TensorBoard event files in
    ``folder`` (each rewritten whole, then put in place); returns the events removed.

    A writer opened with ``purge_step`` already makes TensorBoard hide them; other readers of
    the files (a parser into a data frame, an experiment tracker's sync) know nothing of that
    rule, and would see a redone step twice. A record cut short by a crash ends its file.
    """
    from google.protobuf.message import DecodeError
    from tensorboardX.proto import event_pb2
    from tensorboardX.record_writer import masked_crc32c

    removed = 0
    for path in sorted(folder.glob("*tfevents*")):
        data = path.read_bytes()
        kept: list[bytes] = []
        cut, at = 0, 0
        while at + 12 <= len(data):  # a record: its length (8 bytes), CRC (4), data, CRC (4)
            (size,) = struct.unpack("<Q", data[at : at + 8])
            record = data[at + 12 : at + 12 + size]
            if at + 12 + size + 4 > len(data):
                break
            try:
                event = event_pb2.Event.FromString(record)
            except DecodeError:
                break
            if event.HasField("summary") and event.step > step:
                cut += 1
            else:
                kept.append(record)
            at += 12 + size + 4
        if not cut and at == len(data):
            continue
        tmp = folder / ".cut.tmp"  # no "tfevents" in its name: TensorBoard never reads it
        with tmp.open("wb") as f:
            for record in kept:
                header = struct.pack("<Q", len(record))
                f.write(header + struct.pack("<I", masked_crc32c(header)))
                f.write(record + struct.pack("<I", masked_crc32c(record)))
        tmp.replace(path)
        removed += cut
    return removed


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def logged_steps(run_dir: str | Path) -> list[int]:
    """The steps ``RUN_DIR/metrics.jsonl`` holds records of, in order (none without the file;
    a line cut short by a crash is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            steps.append(int(json.loads(line)["step"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return steps


class PhaseClock:
    """Times the phases of a run and shows the long ones with a rich progress bar.

    The one owner of phase times: ``with clock.phase("rollout", total=16, times=t) as advance:
    ... advance()`` shows a bar and adds the elapsed seconds to ``t["rollout"]``;
    ``with clock.timed("train", t):`` only times. Without ``times`` the seconds land in the
    clock's own :attr:`times`. A phase that repeats into the same ``times`` is summed.
    """

    def __init__(self, console: Console | None = None, *, show: bool = True) -> None:
        self.console = console or make_console(stderr=True)
        self.show = show
        self.times: PhaseTimes = {}
        self._started = time.perf_counter()

    def reset(self) -> PhaseTimes:
        times, self.times = self.times, {}
        return times

    def elapsed(self) -> float:
        """Seconds since the clock was made (a run's wall time)."""
        return time.perf_counter() - self._started

    @contextmanager
    def timed(self, key: str, times: PhaseTimes | None = None) -> Iterator[None]:
        """Time the block: its seconds are added to ``times[key]`` (however the block ends)."""
        sheet = self.times if times is None else times
        start = time.perf_counter()
        try:
            yield
        finally:
            sheet[key] = sheet.get(key, 0.0) + time.perf_counter() - start

    @contextmanager
    def phase(
        self,
        name: str,
        total: int | None = None,
        *,
        times: PhaseTimes | None = None,
        key: str | None = None,
    ) -> Iterator[Any]:
        """Show ``name``'s progress bar and time it under ``key`` (default: ``name``)."""
        with self.timed(key or name, times):
            if not self.show:
                yield lambda n=1: None
                return
            progress = Progress(
                TextColumn(f"[bold cyan]{name:<10}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}" if total else ""),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            with progress:
                task = progress.add_task(name, total=total)

                def advance(n: int = 1) -> None:
                    progress.advance(task, n)

                try:
                    yield advance
                finally:
                    if total is None:
                        progress.update(task, total=1, completed=1)


class GpuMemoryProbe:
    """Used memory of every GPU of the run, read where it is used (``mem_get_info`` in each
    trainer rank and engine: it counts every process on that GPU). Keyed ``gpu<id>`` (with
    ``n<k>.`` for node ``k`` when the run spans nodes); GPUs without a CUDA reader are absent
    (``--device cpu``)."""

    def __init__(self, learner: Any, engines: Sequence[RemoteEngine | RecoverableEngine]) -> None:
        self.learner, self.engines = learner, list(engines)
        self._engine_gpus: list[tuple[str, str]] | None = None

    async def _engines_where(self) -> list[tuple[str, str]]:
        if self._engine_gpus is None:
            infos = await asyncio.gather(
                *(e.info(timeout_s=ENGINE_PROBE_TIMEOUT_S) for e in self.engines)
            )
            self._engine_gpus = [
                (str(i.get("node_id")), str((i.get("gpu_ids") or ["?"])[0])) for i in infos
            ]
        return self._engine_gpus

    async def __call__(self) -> dict[str, float]:
        ranks, where, stats = await asyncio.gather(
            self.learner.memory(),
            self._engines_where(),
            asyncio.gather(*(e.stats(timeout_s=ENGINE_PROBE_TIMEOUT_S) for e in self.engines)),
        )
        readings: dict[tuple[str, str], float] = {}
        for r in ranks:
            if "gpu_used_bytes" in r and r.get("gpu_ids"):
                key = (str(r.get("node_id", "")), str(r["gpu_ids"][0]))
                readings[key] = max(readings.get(key, 0.0), float(r["gpu_used_bytes"]))
        for (node, gpu), st in zip(where, stats, strict=True):
            if "gpu_used_bytes" in st:
                key = (node, gpu)
                readings[key] = max(readings.get(key, 0.0), float(st["gpu_used_bytes"]))
        # rank and engine reports name nodes differently; fold by GPU id on one node
        nodes = sorted({n for n, _ in readings if n})
        out: dict[str, float] = {}
        for (node, gpu), used in sorted(readings.items()):
            prefix = f"n{nodes.index(node)}." if len(nodes) > 1 and node in nodes else ""
            name = f"{prefix}gpu{gpu}"
            out[name] = max(out.get(name, 0.0), used / 1e9)
        return out


def clear_run_records(run_dir: str | Path) -> list[Path]:
    """Remove what a run wrote into ``run_dir`` as it went (``metrics.jsonl``, the sample
    dumps, the watch's examples, TensorBoard's events; the plots are redrawn at the end), so
    that a run started there with ``--overwrite-run-dir`` does not add its records to another
    run's. Returns what was removed. W&B's folder stays: its offline runs may not be synced
    yet, and each is a run of its own."""
    import shutil

    from rl_core.watch import WATCH_FILE

    root = Path(run_dir)
    removed = []
    for name in (METRICS_FILE, "samples", WATCH_FILE, "tb"):
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed
