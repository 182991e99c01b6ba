"""The held-out evaluation of a run: accuracy (pass@1 over n samples), mean reward, and pass@1
by math-verify alone (``eval/verified_accuracy``), the figure runs with different rewards share.

It runs before training (``--eval-before-and-after``), every ``--eval-interval`` steps and after
the last step, on the rollout engines with the run's reward path: the trainer hands it its own
generate-and-score, so an evaluation sample is produced and judged exactly like a training one,
with its own sampling settings (``--eval-*``) and seeds that never meet the training ones.
``rl-core eval`` (``rl_core.evaluate``) runs the same :meth:`Evaluation.run` on a model outside a
run; it adds unbiased pass@k (:func:`pass_at_k`) when there are several samples per prompt.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any, Protocol

from rl_core.config import TrainConfig
from rl_core.data import PromptDataset
from rl_core.judge_audit import rule_agreement, verdict_source, verified_pass1
from rl_core.metrics import PhaseTimes
from rl_core.rollout import SEED_EVAL, RolloutSettings, make_group
from rl_core.sample import Sample, accuracy

__all__ = [
    "Evaluation",
    "GenerateAndScore",
    "measure",
    "pass_at_k",
    "pass_at_k_metrics",
    "pass_k_values",
]


class GenerateAndScore(Protocol):
    """The trainer's rollout: generate ``groups`` and score every sample."""

    async def __call__(
        self,
        groups: list[list[Sample]],
        settings: RolloutSettings,
        *,
        seed_key: tuple[int, int],
        label: str,
        times: PhaseTimes,
    ) -> list[Sample]: ...


class Evaluation:
    """When the run evaluates, on what, and what the evaluations measured (:attr:`history`)."""

    def __init__(self, cfg: TrainConfig, data: PromptDataset | None) -> None:
        self.cfg = cfg
        #: the evaluation set (None: the run has none, and an evaluation measures nothing)
        self.data = data
        #: one record per evaluation: ``{"step": ..., "eval/...": ...}`` (the summary's lines)
        self.history: list[dict[str, Any]] = []
        #: the samples of the latest evaluation (``rl-core eval`` writes them out)
        self.last_samples: list[Sample] = []

    @property
    def before_training(self) -> bool:
        """Whether the run evaluates once before its first step."""
        return self.cfg.eval_before_and_after and self.data is not None

    def due(self, step: int) -> bool:
        """Whether the run evaluates after step ``step`` (1-based)."""
        cfg = self.cfg
        last = step == cfg.num_rollout and cfg.eval_before_and_after
        return bool(cfg.eval_interval and step % cfg.eval_interval == 0) or last

    def settings(self, rollout: RolloutSettings) -> RolloutSettings:
        """The evaluation's sampling: the rollout's, with the ``--eval-*`` flags."""
        cfg = self.cfg
        return dataclasses.replace(
            rollout,
            n_samples_per_prompt=cfg.n_samples_per_eval_prompt,
            max_response_len=cfg.eval_max_response_len or cfg.rollout_max_response_len,
            temperature=cfg.eval_temperature
            if cfg.eval_temperature is not None
            else cfg.rollout_temperature,
            max_prompt_len=None,
            need_logprobs=False,
        )

    async def run(
        self, step: int, generate: GenerateAndScore, rollout: RolloutSettings
    ) -> dict[str, Any]:
        """Evaluate after step ``step`` (0: before training): its ``eval/`` metrics."""
        if self.data is None:
            return {}
        cfg = self.cfg
        records = self.data.records[: cfg.eval_limit]
        groups = [
            make_group(r, gid, cfg.n_samples_per_eval_prompt) for gid, r in enumerate(records)
        ]
        samples = await generate(
            groups, self.settings(rollout), seed_key=(SEED_EVAL, step), label="eval", times={}
        )
        self.last_samples = samples
        out = measure(samples) | await verified_pass1(samples, "eval/")
        self.history.append({"step": step, **out})
        return out


def measure(samples: list[Sample]) -> dict[str, Any]:
    """An evaluation's metrics: pass@1 averaged over prompts, mean reward over the scored
    samples, judge errors, lengths and the judge's agreement with math-verify."""
    scored = [s for s in samples if s.reward is not None]
    per_prompt: dict[int, list[float]] = {}
    for s in scored:
        a = accuracy(s)
        if a is not None:
            per_prompt.setdefault(s.group_id, []).append(a)
    pass1 = [statistics.fmean(v) for v in per_prompt.values()]
    return {
        "eval/accuracy": statistics.fmean(pass1) if pass1 else None,
        "eval/reward_mean": statistics.fmean([s.reward or 0.0 for s in scored]) if scored else None,
        "eval/judge_errors": sum(1 for s in samples if s.status == "judge_error"),
        "eval/judge_timeouts": sum(1 for s in samples if s.status == "judge_timeout"),
        "eval/samples": len(samples),
        "eval/response_len_mean": statistics.fmean(s.response_length for s in samples),
        **rule_agreement(samples, [verdict_source(s) for s in samples], "eval/"),
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code"): the chance that at least one of ``k`` samples drawn without replacement
    from ``n``, ``c`` of them correct, is correct: ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # the product form of the ratio of binomials: no huge integers, no cancellation
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_k_values(n: int) -> list[int]:
    """The k reported for ``n`` samples per prompt: the powers of 2 up to ``n``, and ``n``."""
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


def pass_at_k_metrics(samples: Sequence[Sample], n: int, prefix: str = "eval/") -> dict[str, Any]:
    """``{prefix}pass@k`` for each k of :func:`pass_k_values`, averaged over prompts.

    A sample with a judge error has no verdict: it is left out (as from pass@1), so a prompt
    counts with the samples that were scored; a prompt with fewer than k of them is left out of
    pass@k for that k (``{prefix}pass@k_prompts`` says over how many prompts each is).
    """
    per_prompt: dict[int, list[float]] = {}
    for s in samples:
        a = accuracy(s) if s.reward is not None else None
        if a is not None:
            per_prompt.setdefault(s.group_id, []).append(a)
    out: dict[str, Any] = {}
    for k in pass_k_values(n):
        values = [
            pass_at_k(len(v), sum(1 for a in v if a >= 0.5), k)
            for v in per_prompt.values()
            if len(v) >= k
        ]
        out[f"{prefix}pass@{k}"] = statistics.fmean(values) if values else None
        out[f"{prefix}pass@{k}_prompts"] = len(values)
    return out
