"""Does the judge's reward teach the policy? The learning recipe, its control runs, and its figure.

The embedded Gemma 3 270M *base* model is trained with GRPO on ``gen:sums-2d1d`` (a two-digit
number plus a one-digit one, four solved examples then the open sum; see
``rl_core.generated``) and evaluated greedily every 10 steps on the 200 held-out sums. Four
runs share every flag but the reward:

* ``judge`` (seeds 1 and 2): the embedded judge decides every reward (``--no-rule-gate``);
  math-verify only audits it;
* ``math`` (seed 1): math-verify alone, the rule reward the judge stands in for;
* ``null`` (seed 1): a coin that pays 1 at the judge run's own rate of 1s, blind to the answer.

Every run's evaluation is scored by math-verify (``eval/verified_accuracy``), whatever its
reward, so the four curves share one referee. A run takes about 20 min on a 2-core CPU.

    python benchmarks/learning.py run judge --seed 1
    python benchmarks/learning.py run judge --seed 2
    python benchmarks/learning.py run math --seed 1
    python benchmarks/learning.py run null --seed 1     # reads the judge run's rate of 1s
    python benchmarks/learning.py report                # table + docs/learning.png

Each ``run`` prints the one ``rl-core train`` command it executes; the runs land in
``runs/learning/<reward>-s<seed>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "learning"
FIGURE = ROOT / "docs" / "learning.png"

#: Every run's flags but the reward: 40 steps of 8 prompts × 4 samples, greedy eval of all 200
#: held-out sums every 10 steps. lr 3e-6: at 1e-5 the policy's entropy fell from 0.86 to 0.12
#: in 19 steps and it collapsed onto wrong three-digit answers (eval 0.32 → 0.00).
RECIPE = [
    "--preset", "cpu-demo",
    "--prompt-data", "gen:sums-2d1d",
    "--eval-prompt-data", "gen:sums-2d1d-eval",
    "--eval-limit", "200",
    "--eval-interval", "10",
    "--eval-temperature", "0",
    "--eval-max-response-len", "6",
    "--rollout-max-response-len", "6",
    "--num-rollout", "40",
    "--rollout-batch-size", "8",
    "--n-samples-per-prompt", "4",
    "--lr", "3e-6",
    "--overwrite-run-dir",
]  # fmt: skip

REWARDS = {
    "judge": ["--rm-type", "dapo-genrm", "--no-rule-gate", "--rule-audit"],
    "math": ["--rm-type", "math"],
    "null": ["--custom-rm-path", "learning_null:score"],
}


def run_dir(reward: str, seed: int) -> Path:
    return RUNS / f"{reward}-s{seed}"


def metrics(path: Path) -> list[dict]:
    with (path / "metrics.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def judge_rate(seed: int = 1) -> float:
    """The judge run's share of 1s over its training samples (what the coin pays at)."""
    rows = [r for r in metrics(run_dir("judge", seed)) if "rollout/reward_mean" in r]
    return statistics.fmean(r["rollout/reward_mean"] for r in rows)


def run(reward: str, seed: int) -> int:
    out = run_dir(reward, seed)
    cmd = [
        "rl-core",
        "train",
        *RECIPE,
        *REWARDS[reward],
        "--seed",
        str(seed),
        "--run-dir",
        str(out),
    ]
    env = dict(os.environ)
    if reward == "null":
        env["GENRM_NULL_RATE"] = f"{judge_rate():.4f}"
        env["GENRM_NULL_SEED"] = str(seed)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT / "benchmarks"), env.get("PYTHONPATH")])
        )
        print(f"null reward pays 1 at the judge run's rate: {env['GENRM_NULL_RATE']}")
    print("$ " + shlex.join(cmd), flush=True)
    return subprocess.call(cmd, env=env, cwd=ROOT)


def curves(path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(eval verified pass@1 by step, training reward by step)."""
    rows = metrics(path)
    evals = [
        (r["step"], r["eval/verified_accuracy"])
        for r in rows
        if r.get("eval/verified_accuracy") is not None
    ]
    reward = [(r["step"], r["rollout/reward_mean"]) for r in rows if "rollout/reward_mean" in r]
    return evals, reward


def report() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = sorted(p for p in RUNS.glob("*-s*") if (p / "metrics.jsonl").exists())
    gains: dict[str, float] = {}
    fig, (ax_eval, ax_reward) = plt.subplots(1, 2, figsize=(11, 4))
    print(
        "| run | eval pass@1 before | after | gain (pts) | mean training reward | steps "
        "| wall (first eval → last) |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in found:
        evals, reward = curves(path)
        rows = metrics(path)
        wall = (rows[-1]["time"] - rows[0]["time"]) / 60
        (line,) = ax_eval.plot(*zip(*evals, strict=True), marker="o", label=path.name)
        steps, values = zip(*reward, strict=True)
        smooth = [statistics.fmean(values[max(0, i - 4) : i + 1]) for i in range(len(values))]
        ax_reward.plot(steps, values, color=line.get_color(), alpha=0.25)
        ax_reward.plot(steps, smooth, color=line.get_color(), label=f"{path.name} (5-step mean)")
        gain = 100 * (evals[-1][1] - evals[0][1])
        gains[path.name] = gain
        mean_r = statistics.fmean(r for _, r in reward)
        print(
            f"| {path.name} | {evals[0][1]:.3f} | {evals[-1][1]:.3f} | {gain:+.1f} | {mean_r:.3f} "
            f"| {reward[-1][0]} | {wall:.1f} min |"
        )
    ax_eval.set(
        title="held-out greedy pass@1 (math-verify), 200 sums", xlabel="step", ylabel="pass@1"
    )
    ax_reward.set(title="training reward (each run's own)", xlabel="step", ylabel="mean reward")
    for ax in (ax_eval, ax_reward):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    FIGURE.parent.mkdir(exist_ok=True)
    fig.savefig(FIGURE, dpi=110)
    print(f"\nfigure: {FIGURE.relative_to(ROOT)}")
    print_targets(gains)


def print_targets(gains: dict[str, float]) -> None:
    """The recipe's three targets (issue text in the module docstring's terms), met or not."""
    judge = {k: v for k, v in gains.items() if k.startswith("judge-")}
    print("\ntargets:")
    for name, gain in sorted(judge.items()):
        print(
            f"  {name}: gain {gain:+.1f} pts, target >= +15: {'met' if gain >= 15 else 'NOT met'}"
        )
    math = gains.get("math-s1")
    if judge and math:
        ratio = statistics.fmean(judge.values()) / math if math > 0 else float("inf")
        verdict = "met" if ratio >= 0.8 else "NOT met"
        print(f"  judge mean gain / math-verify gain: {ratio:.2f}, target >= 0.8: {verdict}")
    if "null-s1" in gains:
        null = gains["null-s1"]
        print(f"  null-s1: gain {null:+.1f} pts, target <= +3: {'met' if null <= 3 else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="one training run of the recipe")
    p_run.add_argument("reward", choices=sorted(REWARDS))
    p_run.add_argument("--seed", type=int, default=1)
    sub.add_parser("report", help="the table and the figure from runs/learning/")
    args = parser.parse_args()
    if args.cmd == "run":
        return run(args.reward, args.seed)
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
