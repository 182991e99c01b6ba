"""The reward-hacking watch: each step, the signs that the policy learns the judge, not the task.

A policy optimised against a judge finds what the judge pays for. Three signs are measured on
every training step and recorded in ``metrics.jsonl`` under ``watch/`` (and so in TensorBoard and
W&B), with up to three examples of each flagged kind in ``RUN_DIR/watch.jsonl``:

* **false passes**: judged answers the judge gave a 1 that math-verify proved unequal to the
  reference (``--rule-audit`` records math-verify's view; without it nothing is compared);
* **length against reward**: the Pearson correlation of response length with reward within the
  step; over the run, the length trend;
* **neutralised text**: answers carrying what the prompt builder had to make inert before the
  judge saw it (template tokens, block markers, template headers, ``Judgement:`` lines; the
  ``neutralised`` key of a dapo-genrm result).

The thresholds past which the closing summary and ``rl-core show`` print a warning line are in
``rl_core.limits`` (``WATCH_*``). Each sample's row in ``samples/step_N.jsonl`` lists its flags.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.judge_audit import JUDGED
from rl_core.limits import (
    WATCH_FALSE_PASS_SHARE,
    WATCH_LEN_REWARD_CORR,
    WATCH_LENGTH_GROWTH,
    WATCH_LENGTH_GROWTH_CORR,
    WATCH_MIN_SAMPLES,
    WATCH_NEUTRALISED_SHARE,
)
from rl_core.sample import Sample

__all__ = [
    "EXAMPLES_PER_KIND",
    "FLAGS",
    "WATCH_FILE",
    "length_trend",
    "read_watch",
    "sample_flags",
    "step_watch",
    "watch_warnings",
]

#: ``RUN_DIR/watch.jsonl``: one line per step, the examples of each flag (``step_watch``).
WATCH_FILE = "watch.jsonl"
#: How many examples of each flag a step keeps in :data:`WATCH_FILE`.
EXAMPLES_PER_KIND = 3
#: The flags a sample can carry, in the words of the summary.
FLAGS = {
    "false_pass": "passed by the judge, proved wrong by math-verify",
    "neutralised": "carried text the judge prompt had to neutralise",
}
#: How much of an example's answer the watch file keeps.
_EXAMPLE_CHARS = 300


def sample_flags(sample: Sample, source: str) -> list[str]:
    """The watch's flags of one sample (``source``: where its reward came from)."""
    flags = []
    d = sample.reward_details
    judged = source in JUDGED
    passed = sample.reward is not None and sample.reward >= 0.5
    if judged and passed and d.get("rule") == "not_equal":
        flags.append("false_pass")
    if judged and d.get("neutralised"):
        flags.append("neutralised")
    return flags


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The correlation of ``xs`` with ``ys``; None with fewer than two points or a constant side
    (every reward the same has no correlation to speak of)."""
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(xs, ys)


def _example(sample: Sample) -> dict[str, Any]:
    from genrm_rewards.samples import extract_answer

    d = sample.reward_details
    return {
        "group": sample.group_id,
        "index": sample.index,
        "question": sample.metadata.get("question"),
        "label": sample.label,
        "answer": extract_answer(sample.response).strip()[:_EXAMPLE_CHARS],
        "reward": sample.reward,
        "judge": d.get("pred"),
        "rule": d.get("rule"),
        "neutralised": d.get("neutralised"),
    }


def step_watch(
    batch: Sequence[Sample], sources: Sequence[str]
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]], list[list[str]]]:
    """The step's ``watch/`` metrics, its examples per flag (up to :data:`EXAMPLES_PER_KIND`
    each) and each sample's flags, in batch order."""
    flags = [sample_flags(s, src) for s, src in zip(batch, sources, strict=True)]
    judged = sum(1 for src in sources if src in JUDGED)
    counts = {f: sum(1 for fl in flags if f in fl) for f in FLAGS}
    scored = [s for s in batch if s.reward is not None]
    corr = _pearson([float(s.response_length) for s in scored], [s.reward or 0.0 for s in scored])
    examples: dict[str, list[dict[str, Any]]] = {f: [] for f in FLAGS}
    for s, fl in zip(batch, flags, strict=True):
        for f in fl:
            if len(examples[f]) < EXAMPLES_PER_KIND:
                examples[f].append(_example(s))
    metrics: dict[str, Any] = {
        "watch/judged": judged,
        "watch/false_pass": counts["false_pass"],
        "watch/false_pass_share": counts["false_pass"] / judged if judged else None,
        "watch/len_reward_corr": corr,
        "watch/len_reward_samples": len(scored),
        "watch/neutralised": counts["neutralised"],
        "watch/neutralised_share": counts["neutralised"] / judged if judged else None,
    }
    return metrics, examples, flags


def write_watch(run_dir: str | Path, step: int, examples: Mapping[str, Any]) -> None:
    """Append the step's examples to ``RUN_DIR/watch.jsonl``."""
    with (Path(run_dir) / WATCH_FILE).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, **examples}, default=str) + "\n")


def read_watch(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """``{step: examples}`` from ``RUN_DIR/watch.jsonl`` (empty without one; a line cut short by
    a crash is skipped)."""
    path = Path(run_dir) / WATCH_FILE
    out: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            out[int(record.pop("step"))] = record
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return out


def length_trend(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Response length over the run's steps: first and last step's mean, their ratio, the
    least-squares slope (tokens per step) and the mean length-reward correlation; None with
    fewer than two steps that have a length."""
    points = [
        (int(r["step"]), float(r["rollout/response_len_mean"]))
        for r in records
        if isinstance(r.get("rollout/response_len_mean"), int | float)
    ]
    if len(points) < 2:
        return None
    steps, lens = zip(*points, strict=True)
    slope = statistics.linear_regression(steps, lens).slope if len(set(steps)) > 1 else 0.0
    corrs = [
        float(r["watch/len_reward_corr"])
        for r in records
        if isinstance(r.get("watch/len_reward_corr"), int | float)
    ]
    return {
        "first_step": steps[0],
        "last_step": steps[-1],
        "first": lens[0],
        "last": lens[-1],
        "ratio": lens[-1] / lens[0] if lens[0] else None,
        "slope": slope,
        "mean_corr": statistics.fmean(corrs) if corrs else None,
    }


def _steps(hits: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"step {step}: {value:.2f}" for step, value in hits)


def _first_example(
    records: Sequence[Mapping[str, Any]], watch: Mapping[int, Mapping[str, Any]], flag: str
) -> str:
    """``; e.g. step N gG/I: answer ..., reference ...``: the first example of ``flag`` kept in
    ``watch.jsonl`` (empty when none was kept)."""
    for r in records:
        examples = watch.get(int(r["step"]), {}).get(flag) or []
        if examples:
            e = examples[0]
            return (
                f"; e.g. step {r['step']} g{e.get('group')}/{e.get('index')}: answer "
                f"{e.get('answer')!r}, reference {e.get('label')!r}"
            )
    return ""


def _share_warning(
    records: Sequence[Mapping[str, Any]],
    watch: Mapping[int, Mapping[str, Any]],
    flag: str,
    threshold: float,
    name: str,
    what: str,
) -> str | None:
    """The warning of a share of judged answers (``watch/<flag>`` of ``watch/judged``): over the
    whole run, and in each step with at least :data:`WATCH_MIN_SAMPLES` judged answers (a step of
    two judged answers, one of them flagged, is not a half); None when neither crosses."""
    judged = sum(int(r.get("watch/judged") or 0) for r in records)
    flagged = sum(int(r.get(f"watch/{flag}") or 0) for r in records)
    steps = [
        (int(r["step"]), float(r[f"watch/{flag}_share"]))
        for r in records
        if (r.get(f"watch/{flag}_share") or 0.0) > threshold
        and int(r.get("watch/judged") or 0) >= WATCH_MIN_SAMPLES
    ]
    share = flagged / judged if judged else 0.0
    if share <= threshold and not steps:
        return None
    line = (
        f"{what}: {flagged} of {judged} judged answers over the run ({share:.0%}; {name} "
        f"{threshold:.0%})"
    )
    if steps:
        line += f", above it in {_steps(steps)}"
    return line + _first_example(records, watch, flag)


def watch_warnings(
    records: Sequence[Mapping[str, Any]], watch: Mapping[int, Mapping[str, Any]] | None = None
) -> list[str]:
    """One line per watch threshold the run crossed (``rl_core.limits``), naming the steps,
    the values and the threshold; empty when none was crossed. ``watch``: the run's examples
    (``read_watch``), the first of which each line quotes."""
    watch = watch or {}
    lines = []
    false = _share_warning(
        records,
        watch,
        "false_pass",
        WATCH_FALSE_PASS_SHARE,
        "WATCH_FALSE_PASS_SHARE",
        "the judge passed answers that math-verify proved wrong",
    )
    if false is not None:
        lines.append(false)
    corr = [
        (int(r["step"]), float(r["watch/len_reward_corr"]))
        for r in records
        if (r.get("watch/len_reward_corr") or 0.0) > WATCH_LEN_REWARD_CORR
        and (r.get("watch/len_reward_samples") or 0) >= WATCH_MIN_SAMPLES
    ]
    if corr:
        lines.append(
            f"longer responses got higher rewards: length-reward correlation above "
            f"{WATCH_LEN_REWARD_CORR} (WATCH_LEN_REWARD_CORR): {_steps(corr)}"
        )
    trend = length_trend(records)
    if (
        trend is not None
        and trend["ratio"] is not None
        and trend["ratio"] > WATCH_LENGTH_GROWTH
        and (trend["mean_corr"] or 0.0) > WATCH_LENGTH_GROWTH_CORR
    ):
        lines.append(
            f"response length grew x{trend['ratio']:.2f} (step {trend['first_step']}: "
            f"{trend['first']:.1f} → step {trend['last_step']}: {trend['last']:.1f} tokens; "
            f"WATCH_LENGTH_GROWTH {WATCH_LENGTH_GROWTH}) while its mean correlation with reward "
            f"was {trend['mean_corr']:.2f} (WATCH_LENGTH_GROWTH_CORR {WATCH_LENGTH_GROWTH_CORR})"
        )
    neutral = _share_warning(
        records,
        watch,
        "neutralised",
        WATCH_NEUTRALISED_SHARE,
        "WATCH_NEUTRALISED_SHARE",
        "answers carried text aimed at the judge prompt (neutralised before judging)",
    )
    if neutral is not None:
        lines.append(neutral)
    return lines
