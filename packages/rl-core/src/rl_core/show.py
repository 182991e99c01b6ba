"""``rl-core show RUN_DIR``: a run in the terminal, readable without reading JSON.

It reads only the run's files — ``metrics.jsonl``, ``samples/step_N.jsonl``, ``watch.jsonl``,
``config.json`` and the PNG curves beside them — so it works on a finished run, a crashed one,
one still going, or one copied from another machine:

* ``rl-core show RUN``: the closing summary rebuilt from ``metrics.jsonl`` (phases, steps,
  verdict sources, evaluations, the reward-hacking watch and its warnings), then the curves'
  figures: per metric its first, last, min and max value and a sparkline over the steps;
* ``--step N``: that step's samples, one line each (``--status``, ``--source``, ``--flagged``
  by the watch, ``--disagree`` with math-verify filter them; without ``--step``, the filters
  look through every step);
* ``--step N --sample I``: one sample's whole record (``I`` is the ``#`` column), the judge's
  part included.

A folder that is not a run is refused in one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rl_core.judge_audit import disagrees_with_rule
from rl_core.metrics import METRICS_FILE
from rl_core.terminal import make_console
from rl_core.wandb_mirror import judge_reply
from rl_core.watch import FLAGS, read_watch, watch_warnings

__all__ = ["NotARunError", "RunFiles", "history_from_records", "load_run", "sample_matches"]

#: The metric families the curves' table shows by default (``--all-metrics``: every one).
CURVE_PREFIXES = ("rollout/", "eval/", "train/", "adv/", "watch/")
_SPARKS = "▁▂▃▄▅▆▇█"
#: The most steps a sparkline draws (the last ones).
SPARK_WIDTH = 40
#: How much of a response a sample's line shows.
RESPONSE_CHARS = 60


class NotARunError(ValueError):
    """The folder holds no readable ``metrics.jsonl``: it is not a run directory."""


@dataclass
class RunFiles:
    """What a run directory holds, read once."""

    root: Path
    records: list[dict[str, Any]]
    config: dict[str, Any] | None
    watch: dict[int, dict[str, Any]]
    #: step → its ``samples/step_N.jsonl``
    samples: dict[int, Path] = field(default_factory=dict)

    def rows(self, step: int) -> list[dict[str, Any]]:
        """The sample rows of ``step`` (a line cut short by a crash is skipped)."""
        rows = []
        for line in self.samples[step].read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows


def load_run(run_dir: str | Path) -> RunFiles:
    """Read a run directory; :class:`NotARunError` (one line) when it is not one."""
    root = Path(run_dir)
    path = root / METRICS_FILE
    if not root.is_dir():
        raise NotARunError(f"{run_dir}: no such folder")
    if not path.is_file():
        raise NotARunError(f"{run_dir}: not a run folder (no {METRICS_FILE})")
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            int(record["step"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise NotARunError(
                f"{path}: line {n} is not a metrics record ({type(err).__name__}: {err})"
            ) from None
        records.append(record)
    config = None
    if (root / "config.json").is_file():
        try:
            config = json.loads((root / "config.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            config = None
    samples = {}
    for f in sorted((root / "samples").glob("step_*.jsonl")):
        number = f.stem.removeprefix("step_")
        if number.isdigit():
            samples[int(number)] = f
    return RunFiles(root, records, config, read_watch(root), samples)


def history_from_records(records: Iterable[dict[str, Any]]) -> list[Any]:
    """The summary's ``StepRecord`` of each training step of ``metrics.jsonl`` (a record of
    rollout samples; an evaluation before training is not a step)."""
    from rl_core.trainer import StepRecord

    history = []
    for r in records:
        if "rollout/samples" not in r:
            continue
        times = {k.removeprefix("time/"): float(v) for k, v in r.items() if k.startswith("time/")}
        verdicts = Counter(
            {k.removeprefix("verdicts/"): int(v) for k, v in r.items() if k.startswith("verdicts/")}
        )
        history.append(
            StepRecord(int(r["step"]), r, times, verdicts, r.get("train/untrained_reason"))
        )
    return history


# --- the run: summary and curves ------------------------------------------------------------


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sparkline(values: Sequence[float]) -> str:
    """``values`` as block characters, lowest ▁ to highest █ (the last :data:`SPARK_WIDTH`)."""
    values = list(values)[-SPARK_WIDTH:]
    if not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        return _SPARKS[len(_SPARKS) // 2] * len(values)
    top = len(_SPARKS) - 1
    return "".join(_SPARKS[round((v - low) / (high - low) * top)] for v in values)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def curves_table(records: Sequence[dict[str, Any]], *, all_metrics: bool = False) -> Table:
    """Per numeric metric: steps, first, last, min, max and a sparkline over the steps."""
    keys: list[str] = []
    for r in records:
        for k, v in r.items():
            if k in ("step", "time") or k in keys or not _number(v):
                continue
            if all_metrics or k.startswith(CURVE_PREFIXES):
                keys.append(k)
    table = Table(title="metrics over the steps (metrics.jsonl)")
    for col in ("metric", "steps", "first", "last", "min", "max"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    table.add_column("curve")
    for key in sorted(keys):
        points = [(int(r["step"]), float(r[key])) for r in records if _number(r.get(key))]
        values = [v for _, v in points]
        steps = f"{points[0][0]}-{points[-1][0]}" if len(points) > 1 else str(points[0][0])
        table.add_row(
            key,
            steps,
            _fmt(values[0]),
            _fmt(values[-1]),
            _fmt(min(values)),
            _fmt(max(values)),
            sparkline(values),
        )
    return table


def show_run(run: RunFiles, console: Console, *, all_metrics: bool = False) -> None:
    """The summary rebuilt from the files, then the curves' figures."""
    from rl_core.summary import render_summary

    cfg = run.config or {}
    mode = str((cfg.get("plan") or {}).get("mode", "?"))
    console.print(Text(f"run {run.root}", style="bold"))
    if cfg:
        what = ", ".join(
            f"{k} {cfg[k]}"
            for k in ("hf_checkpoint", "rm_type", "custom_rm_path", "prompt_data", "num_rollout")
            if cfg.get(k) is not None
        )
        console.print(Text(what))
    history = history_from_records(run.records)
    evals = [r for r in run.records if r.get("eval/samples")]
    render_summary(
        history,
        mode=mode,
        console=console,
        evals=evals,
        records=run.records,
        warnings=watch_warnings(run.records, run.watch),
    )
    console.print(curves_table(run.records, all_metrics=all_metrics))
    figures = [p.name for p in sorted(run.root.glob("*.png"))]
    if figures:
        console.print(Text(f"curves drawn: {', '.join(figures)} (in {run.root})"))
    if run.samples:
        steps = sorted(run.samples)
        console.print(
            Text(
                f"samples of steps {steps[0]}-{steps[-1]}: rl-core show {run.root} --step N "
                "[--flagged | --disagree | --status S | --source S] [--sample I]"
            )
        )


# --- a step's samples -------------------------------------------------------------------------


def sample_matches(
    row: dict[str, Any],
    *,
    status: str | None = None,
    source: str | None = None,
    flagged: bool = False,
    disagree: bool = False,
) -> bool:
    """Whether a sample row passes the filters (all of those given)."""
    if status is not None and row.get("status") != status:
        return False
    if source is not None and row.get("source") != source:
        return False
    if flagged and not row.get("flags"):
        return False
    if disagree:
        rule = (row.get("details") or {}).get("rule")
        if not disagrees_with_rule(str(row.get("source")), row.get("reward"), rule):
            return False
    return True


def _short(text: Any, n: int = RESPONSE_CHARS) -> str:
    flat = str(text if text is not None else "").replace("\n", "⏎")
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def samples_table(picked: Sequence[tuple[int, int, dict[str, Any]]], title: str) -> Table:
    """One line per ``(step, #, row)``."""
    table = Table(title=title)
    for col in ("step", "#", "sample", "reward", "status", "source", "math-verify", "judge"):
        table.add_column(col, justify="right" if col in ("step", "#", "reward") else "left")
    table.add_column("flags")
    table.add_column("response")
    for step, i, row in picked:
        reward = row.get("reward")
        table.add_row(
            str(step),
            str(i),
            f"g{row.get('group')}/{row.get('index')}",
            "-" if reward is None else f"{reward:.2f}",
            str(row.get("status")),
            str(row.get("source")),
            str((row.get("details") or {}).get("rule") or "-"),
            Text(_short(judge_reply(row) or "-", 12)),
            ",".join(row.get("flags") or []),
            Text(_short(row.get("response"))),
        )
    return table


def show_sample(row: dict[str, Any], step: int, index: int, console: Console) -> None:
    """One sample's whole record: every field, the reward details as JSON."""
    table = Table(title=f"step {step}, sample #{index} (g{row.get('group')}/{row.get('index')})")
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in row.items():
        if key == "details":
            continue
        shown = ", ".join(value) if key == "flags" and isinstance(value, list) else value
        table.add_row(key, Text("" if shown is None else str(shown)))
    table.add_row("judge reply", Text(str(judge_reply(row))))
    for flag in row.get("flags") or []:
        table.add_row("watch", Text(f"{flag}: {FLAGS.get(flag, flag)}"))
    console.print(table)
    details = row.get("details") or {}
    console.print(Text("reward details (the judge's record):", style="bold"))
    console.print(Text(json.dumps(details, indent=2, ensure_ascii=False, default=str)))


# --- the ``rl-core show`` subcommand ---------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--step", type=int, default=None, help="show this step's samples")
    parser.add_argument("--sample", type=int, default=None, help="with --step: sample # in full")
    parser.add_argument("--status", default=None, help="samples of this reward status (ok, ...)")
    parser.add_argument(
        "--source", default=None, help="samples whose reward came from (judge, ...)"
    )
    parser.add_argument("--flagged", action="store_true", help="samples the watch flagged")
    parser.add_argument(
        "--disagree", action="store_true", help="judged samples where math-verify disagrees"
    )
    parser.add_argument(
        "--all-metrics", action="store_true", help="every metric in the curves' table"
    )


def _refuse(message: str) -> int:
    print(f"rl-core show: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Exit status 0, or 2 (one line) for a folder that is not a run, a step it does not
    have, or a sample number out of range."""
    try:
        files = load_run(args.run_dir)
    except NotARunError as err:
        return _refuse(str(err))
    console = make_console()
    filters = {
        "status": args.status,
        "source": args.source,
        "flagged": args.flagged,
        "disagree": args.disagree,
    }
    filtering = any(filters.values())
    if args.sample is not None and args.step is None:
        return _refuse("--sample needs --step N (the step the sample # is of)")
    if args.step is None and not filtering:
        show_run(files, console, all_metrics=args.all_metrics)
        return 0
    if not files.samples:
        return _refuse(f"{args.run_dir}: no samples/step_N.jsonl (the run logged no step yet)")
    if args.step is not None and args.step not in files.samples:
        have = sorted(files.samples)
        span = f"steps {have[0]}-{have[-1]}"
        return _refuse(f"{args.run_dir}: no samples of step {args.step} (samples/ has {span})")
    steps = [args.step] if args.step is not None else sorted(files.samples)
    if args.sample is not None:
        rows = files.rows(args.step)
        if not 0 <= args.sample < len(rows):
            return _refuse(
                f"--sample {args.sample}: step {args.step} has samples 0-{len(rows) - 1}"
            )
        show_sample(rows[args.sample], args.step, args.sample, console)
        return 0
    picked = [
        (step, i, row)
        for step in steps
        for i, row in enumerate(files.rows(step))
        if sample_matches(row, **filters)
    ]
    said = ", ".join(
        k if v is True else f"{k} {v}" for k, v in filters.items() if v not in (None, False)
    )
    where = f"step {args.step}" if args.step is not None else f"steps {steps[0]}-{steps[-1]}"
    title = f"samples of {where}" + (f" ({said}): {len(picked)}" if said else f": {len(picked)}")
    console.print(samples_table(picked, title))
    if args.step is not None and picked:
        console.print(
            Text(f"one in full: rl-core show {args.run_dir} --step {args.step} --sample #")
        )
    return 0
