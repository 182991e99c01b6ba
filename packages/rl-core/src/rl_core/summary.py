"""The closing summary of a run: what happened in each phase of each step, where the verdicts
came from (the math-verify rule gate, the judge, the verdict cache, or a failure), and what the
reward-hacking watch saw (``rl_core.watch``), with a warning line per threshold crossed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from rl_core.terminal import make_console
from rl_core.trainer import StepRecord
from rl_core.watch import length_trend, watch_warnings

PHASES = ("rollout", "reward", "reward_wait", "train", "wake", "weight_sync", "eval", "save")


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _agreement(metrics: dict[str, Any], prefix: str) -> str:
    """``0.94 of 16``: the judge's agreement with math-verify and on how many samples."""
    n = metrics.get(f"{prefix}judge_rule_compared")
    if not n:
        return "-"
    return f"{_fmt(metrics.get(f'{prefix}judge_rule_agreement'), 2)} of {n}"


def _phase_table(history: Sequence[StepRecord], mode: str) -> Table:
    times = Table(title=f"phases per step (seconds) — mode {mode}")
    times.add_column("step", justify="right")
    present = [p for p in PHASES if any(p in h.phase_times for h in history)]
    for p in present:
        times.add_column(p, justify="right")
    for h in history:
        times.add_row(str(h.step), *(_fmt(h.phase_times.get(p), 1) for p in present))
    return times


def _handoff_table(history: Sequence[StepRecord]) -> Table | None:
    handoff = sorted({k for h in history for k in h.metrics if k.startswith("handoff/")})
    if not handoff:
        return None
    moves = Table(title="memory handoff per step (seconds): sleep, wake, offload, onload")
    moves.add_column("step", justify="right")
    for k in handoff:
        moves.add_column(k.removeprefix("handoff/").removesuffix("_s"), justify="right")
    moves.add_column("weight sync", justify="right")
    for h in history:
        moves.add_row(
            str(h.step),
            *(_fmt(h.metrics.get(k), 2) for k in handoff),
            f"{_fmt(h.phase_times.get('weight_sync'), 2)} "
            f"({h.metrics.get('weights/sync_path', '-')})",
        )
    return moves


def _memory_table(history: Sequence[StepRecord]) -> Table | None:
    mem = sorted({k for h in history for k in h.metrics if k.startswith("mem/")})
    if not mem:
        return None
    memory = Table(title="GPU memory used at the end of each phase (GB)")
    memory.add_column("step", justify="right")
    for k in mem:
        memory.add_column(k.removeprefix("mem/").removesuffix("_used_gb"), justify="right")
    for h in history:
        memory.add_row(str(h.step), *(_fmt(h.metrics.get(k), 1) for k in mem))
    return memory


def _steps_table(history: Sequence[StepRecord]) -> Table:
    steps = Table(title="what each step learned from")
    # short headers, few columns: readable in an 80-column terminal (the rest is in metrics.jsonl)
    # judge=mv: how often the judge agreed with math-verify where math-verify decided (of n)
    cols = ("step", "reward", "±std", "acc", "judge=mv", "judge err", "adv≠0", "kl", "clip", "len")
    for col in cols:
        steps.add_column(col, justify="right")
    for h in history:
        m = h.metrics
        reward = _fmt(m.get("rollout/reward_mean"), 2)
        scored = m.get("rollout/reward_samples")
        if scored is not None and scored != m.get("rollout/samples"):
            reward += f" ({scored})"  # judge errors have no reward: the mean is over the rest
            steps.caption = "reward (n): the mean over the n samples that have a reward"
        steps.add_row(
            str(h.step),
            reward,
            _fmt(m.get("rollout/reward_std"), 2),
            _fmt(m.get("rollout/acc_mean"), 2),
            _agreement(m, "rollout/"),
            _fmt(m.get("rollout/judge_errors")),
            f"{m.get('adv/nonzero', 0)}/{m.get('rollout/samples', 0)}",
            _fmt(m.get("train/kl"), 4),
            _fmt(m.get("train/clipfrac"), 2),
            _fmt(m.get("rollout/response_len_mean"), 1),
        )
    return steps


#: What each verdict source means, in the summary's words.
_VERDICT_LABELS = {
    "gate": "rule gate (math-verify proved the answer equal; no judge call)",
    "judge": "judge (GenRM verdict)",
    "judge_cache": "judge, reused from the verdict cache",
    "judge_unparsed": "judge answered without a clean verdict (0, counted)",
    "judge_error": "judge failed (masked out of loss and group stats)",
    "judge_timeout": "not judged by the group's deadline (masked out of loss and group stats)",
    "aborted": "generation aborted by the engine (not judged, not trained)",
    "rule": "rule-based reward (no judge)",
}


def _verdicts_table(history: Sequence[StepRecord]) -> Table:
    total: Counter[str] = Counter()
    for h in history:
        total.update(h.verdicts)
    verdicts = Table(title="where the training rewards came from")
    verdicts.add_column("source")
    verdicts.add_column("samples", justify="right")
    for key, n in total.most_common():
        verdicts.add_row(_VERDICT_LABELS.get(key, key), str(n))
    return verdicts


def _untrained_lines(history: Sequence[StepRecord]) -> list[str]:
    """How many responses each step cut off at the length limit (when any), and one line per
    step that trained nothing (no sample in the loss), with why."""
    lines = []
    if any(h.metrics.get("rollout/truncated") for h in history):
        counts = ", ".join(
            f"step {h.step}: {h.metrics.get('rollout/truncated', 0)} of "
            f"{h.metrics.get('rollout/samples', 0)}"
            for h in history
        )
        lines.append(
            f"[bold]cut off at the length limit[/] (judged; in the loss only with "
            f"--keep-cut-off): {counts}"
        )
    restarted = [h for h in history if h.metrics.get("rollout/engine_restarts")]
    if restarted:
        lines.append(
            "[bold]rollout engines re-created[/] (their actor died; the requests they held were "
            "sent again, every sample once): "
            + ", ".join(f"step {h.step}: {h.metrics['rollout/engine_restarts']}" for h in restarted)
        )
    return lines + [
        f"[bold]step {h.step} trained nothing[/]: {h.untrained}; its weights were not changed"
        for h in history
        if h.untrained is not None
    ]


def _eval_lines(history: Sequence[StepRecord], evals: Sequence[dict[str, Any]] | None) -> list[str]:
    if evals is None:
        evals = [{"step": h.step, **h.metrics} for h in history if h.metrics.get("eval/samples")]
    first_step = history[0].step if history else 1
    lines = []
    for m in evals:
        if m["step"] == 0:
            when = "before training"
        elif m["step"] < first_step:  # a resumed run's, of the checkpoint it resumed from
            when = f"of the resumed checkpoint (step {m['step']})"
        else:
            when = f"after step {m['step']}"
        lines.append(
            f"[bold]eval {when}[/]: accuracy (pass@1) {_fmt(m.get('eval/accuracy'))}, "
            f"mean reward {_fmt(m.get('eval/reward_mean'))}, judge agrees with math-verify "
            f"{_agreement(m, 'eval/')}, judge errors {m.get('eval/judge_errors')}, "
            f"{m.get('eval/samples')} samples"
        )
    return lines


def _sum(records: Sequence[dict[str, Any]], key: str) -> int:
    return sum(int(r.get(key) or 0) for r in records)


def watch_lines(
    records: Sequence[dict[str, Any]], warnings: Sequence[str] | None = None
) -> list[str]:
    """The reward-hacking watch over the run (one line), then one warning line per threshold
    crossed (``warnings``: ``watch_warnings``'s, with examples; default: without)."""
    steps = [r for r in records if "watch/judged" in r]
    if not steps:
        return []
    judged = _sum(steps, "watch/judged")
    line = (
        f"[bold]reward-hacking watch[/]: {_sum(steps, 'watch/false_pass')} of {judged} judged "
        f"answers passed by the judge and proved wrong by math-verify, "
        f"{_sum(steps, 'watch/neutralised')} carried text the judge prompt neutralised"
    )
    trend = length_trend(steps)
    if trend is not None:
        corr = trend["mean_corr"]
        line += (
            f"; response length {trend['first']:.1f} → {trend['last']:.1f} tokens (steps "
            f"{trend['first_step']}-{trend['last_step']}, {trend['slope']:+.2f} per step), "
            f"length-reward correlation {'-' if corr is None else f'{corr:.2f}'} on average"
        )
    if warnings is None:
        warnings = watch_warnings(steps)
    return [line] + [f"[bold red]watch warning[/]: {w}" for w in warnings]


def render_summary(
    history: Sequence[StepRecord],
    *,
    mode: str,
    startup: dict[str, float] | None = None,
    total_s: float | None = None,
    precision: str | None = None,
    console: Console | None = None,
    notes: Sequence[str] = (),
    evals: Sequence[dict[str, Any]] | None = None,
    records: Sequence[dict[str, Any]] | None = None,
    warnings: Sequence[str] | None = None,
) -> None:
    """Print per-step phase times, reward statistics and verdict sources (and ``notes`` on
    how the run was set up, e.g. that KL is not computed). ``evals``: every evaluation of the
    run (the evaluation's ``history``, one before training included); else those in
    ``history``. ``records``: the run's ``metrics.jsonl`` (else the steps of ``history``), for
    the reward-hacking watch; ``warnings``: its warning lines (``watch_warnings``)."""
    console = console or make_console()
    if precision:
        console.print(f"[bold]training precision[/]: {precision}")
    for note in notes:
        console.print(f"[bold]note[/]: {note}")
    if startup:
        console.print(
            "[bold]start-up[/]: " + ", ".join(f"{k} {v:.1f}s" for k, v in startup.items())
        )
    console.print(_phase_table(history, mode))
    for table in (_handoff_table(history), _memory_table(history)):
        if table is not None:
            console.print(table)
    console.print(_steps_table(history))
    for line in _untrained_lines(history):
        console.print(line)
    console.print(_verdicts_table(history))
    for line in _eval_lines(history, evals):
        console.print(line)
    if records is None:
        records = [{"step": h.step, **h.metrics} for h in history]
    for line in watch_lines(records, warnings):
        console.print(line)
    if total_s is not None:
        console.print(f"[bold]wall time[/]: {total_s:.1f}s")
