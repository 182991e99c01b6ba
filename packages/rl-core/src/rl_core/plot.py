"""``rl-core plot RUN_DIR``: reward, accuracy and response-length curves of a run, as PNG files.

Reads only ``metrics.jsonl``, so it works on a finished run, a crashed one, or one still going.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rl_core.metrics import read_metrics

#: figure file → (title, [(metric key, label)], y label)
FIGURES: dict[str, tuple[str, list[tuple[str, str]], str]] = {
    "reward.png": (
        "Reward",
        [("rollout/reward_mean", "train reward (mean)"), ("eval/reward_mean", "eval reward")],
        "reward",
    ),
    "accuracy.png": (
        "Accuracy",
        [("rollout/acc_mean", "train accuracy"), ("eval/accuracy", "eval accuracy (pass@1)")],
        "accuracy",
    ),
    "length.png": (
        "Response length",
        [("rollout/response_len_mean", "train"), ("eval/response_len_mean", "eval")],
        "tokens",
    ),
}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the figures of :data:`FIGURES` for a run; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = read_metrics(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, series, ylabel) in FIGURES.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for key, label in series:
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=label)
                std_key = key.replace("_mean", "_std")
                if std_key != key and any(std_key in r for r in records):
                    sd = [r.get(std_key, 0.0) or 0.0 for r in records if r.get(key) is not None]
                    ax.fill_between(
                        xs,
                        [y - s for y, s in zip(ys, sd, strict=True)],
                        [y + s for y, s in zip(ys, sd, strict=True)],
                        alpha=0.2,
                    )
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# --- the ``rl-core plot`` subcommand -------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--out", default=None, help="where to write the PNGs (default: RUN_DIR)")


def run(args: Any) -> int:
    """Exit status 0, or 2 for a folder that is not a run (no or unreadable ``metrics.jsonl``):
    one line that names it, not a traceback."""
    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as err:
        print(f"rl-core plot: {err}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as err:
        print(
            f"rl-core plot: {args.run_dir}/metrics.jsonl: not a metrics file ({err})",
            file=sys.stderr,
        )
        return 2
    for path in paths:
        print(path)
    return 0
