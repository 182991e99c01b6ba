"""Per-step metrics to a JSONL file and TensorBoard, and a rich progress line per phase.

The JSONL file (``RUN_DIR/metrics.jsonl``, one object per step, flat ``section/name`` keys) is the
record ``rl-core plot`` and tests read; TensorBoard (``RUN_DIR/tb``) is for people. Phase times
come from :class:`PhaseClock`, so "time per phase" in the metrics and the summary are the same
numbers the progress display showed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    """Appends one JSON object per step to ``metrics.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._tb: Any = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": time.time(), **metrics}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                numeric = isinstance(value, int | float) and not isinstance(value, bool)
                if numeric and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def log_samples(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Write one step's samples (question, response, reward, verdict source, ...) to
        ``RUN_DIR/samples/<name>.jsonl``: what the policy said and what the judge made of it."""
        folder = self.run_dir / "samples"
        folder.mkdir(exist_ok=True)
        with (folder / f"{name}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")

    def truncate(self, step: int) -> int:
        """Forget every step after ``step`` (a resume from its checkpoint redoes them): the
        records of ``metrics.jsonl``, the sample files, and TensorBoard's events (a writer with
        ``purge_step`` tells TensorBoard to drop them). Returns the records removed."""
        removed = 0
        if self.path.is_file():
            kept = []
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    removed += 1  # a line cut short by the crash that made this a resume
                    continue
                if int(record.get("step", 0)) <= step:
                    kept.append(line)
                else:
                    removed += 1
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            tmp.replace(self.path)
        for f in (self.run_dir / "samples").glob("step_*.jsonl"):
            number = f.stem.removeprefix("step_")
            if number.isdigit() and int(number) > step:
                f.unlink()
        if self._tb is not None:
            from tensorboardX import SummaryWriter

            self._tb.close()
            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=step + 1)
        return removed

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``, in order."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a run directory?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class PhaseClock:
    """Times the phases of a step and shows each with a rich progress bar.

    ``with clock.phase("rollout", total=16) as advance: ... advance()`` — the elapsed seconds land
    in ``clock.times["rollout"]`` (summed if a phase repeats within a step).
    """

    def __init__(self, console: Console | None = None, *, show: bool = True) -> None:
        self.console = console or Console(stderr=True)
        self.show = show
        self.times: dict[str, float] = {}

    def reset(self) -> dict[str, float]:
        times, self.times = self.times, {}
        return times

    @contextmanager
    def phase(self, name: str, total: int | None = None) -> Iterator[Any]:
        start = time.perf_counter()
        if not self.show:
            try:
                yield lambda n=1: None
            finally:
                self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start
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
                self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start
