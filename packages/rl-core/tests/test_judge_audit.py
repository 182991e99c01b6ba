"""The judge measured against math-verify in a run, and the evaluation before and after training.

``rule_agreement`` is pure; the trainer test runs the tiny GRPO stack (test engine, scripted
reward) with ``--eval-before-and-after``: an evaluation at step 0 and one after the last step,
both logged, both in the summary, each with the judge's agreement with math-verify.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rich.console import Console

from rl_core.data import load_prompt_data
from rl_core.judge_audit import rule_agreement, verdict_source, verified_pass1
from rl_core.metrics import read_metrics
from rl_core.sample import Sample
from rl_core.summary import render_summary


def _sample(reward: float | None, status: str, rule: str | None, **details: Any) -> Sample:
    s = Sample(prompt="p", label="12", metadata={}, group_id=0)
    s.reward, s.status = reward, status  # type: ignore[assignment]
    s.reward_details = {"gate": "off", **details, **({"rule": rule} if rule else {})}
    return s


def _answered(group: int, response: str, reward: float, **details: Any) -> Sample:
    s = Sample(prompt="p", label="12", metadata={}, group_id=group, response=response)
    s.reward, s.status, s.reward_details = reward, "ok", details  # type: ignore[assignment]
    return s


def test_evaluation_pass1_is_math_verifys_whatever_the_reward_said():
    """A coin (or a fooled judge) paid 1 to wrong answers: the verified figure ignores it."""
    samples = [
        _answered(0, " 12", 0.0),  # right, the reward said 0
        _answered(0, " 13", 1.0),  # wrong, the reward said 1
        _answered(1, " 7", 1.0, rule="not_equal"),  # the audit's own view is reused
        _answered(2, " twelve?", 1.0),  # math-verify cannot read it: not a right answer
    ]
    got = asyncio.run(verified_pass1(samples, "eval/"))
    assert got == {
        "eval/verified_accuracy": pytest.approx((0.5 + 0.0 + 0.0) / 3),
        "eval/verified_timeouts": 0,
    }


@pytest.mark.parametrize(
    ("samples", "want"),
    [
        pytest.param([], (None, 0), id="nothing"),
        pytest.param(
            [_sample(1.0, "ok", "equal"), _sample(0.0, "ok", "not_equal")], (1.0, 2), id="agree"
        ),
        pytest.param(
            [_sample(1.0, "ok", "not_equal"), _sample(0.0, "ok", "not_equal")],
            (0.5, 2),
            id="judge-says-1-to-a-wrong-answer",
        ),
        pytest.param(
            [_sample(0.0, "unparsed", "not_equal"), _sample(1.0, "ok", "equal")],
            (0.5, 2),
            id="unparsed-is-no-agreement",
        ),
        pytest.param(
            [_sample(1.0, "ok", "undecided"), _sample(1.0, "ok", "timeout")],
            (None, 0),
            id="math-verify-undecided",
        ),
        pytest.param(
            [_sample(1.0, "ok", "equal", gate="hit"), _sample(None, "judge_error", "equal")],
            (None, 0),
            id="not-judged",
        ),
        pytest.param(
            [_sample(1.0, "ok", "equal", cache="hit"), _sample(0.0, "ok", None)],
            (1.0, 1),
            id="cached-verdict-counts-no-audit-does-not",
        ),
    ],
)
def test_rule_agreement(samples: list[Sample], want: tuple[float | None, int]) -> None:
    out = rule_agreement(samples, [verdict_source(s) for s in samples], "rollout/")
    assert (out["rollout/judge_rule_agreement"], out["rollout/judge_rule_compared"]) == want


class AuditedReward:
    """A scripted judge (1 when the response has a digit) audited by a scripted rule (equal
    when it has a "1"): the two disagree on some samples, as a real judge would."""

    async def __call__(self, args: object, sample: Sample) -> dict[str, Any]:
        score = 1.0 if any(c.isdigit() for c in sample.response) else 0.0
        rule = "equal" if "1" in sample.response else "not_equal"
        return {"score": score, "status": "ok", "gate": "off", "acc": int(score), "rule": rule}


async def test_eval_before_and_after_with_judge_agreement(  # type: ignore[no-untyped-def]
    tmp_path, grpo_config, grpo_trainer
):
    cfg = grpo_config(tmp_path, num_rollout=2, eval_before_and_after=True, eval_limit=2)
    trainer, _, _ = await grpo_trainer(
        cfg, reward=AuditedReward(), eval_data=load_prompt_data(cfg.prompt_data)
    )
    history = await trainer.run()
    evals = trainer.evaluation.history

    assert [e["step"] for e in evals] == [0, 2]  # before step 1, after the last
    records = read_metrics(cfg.run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "eval/accuracy" in records[0] and "eval/accuracy" in records[2]
    assert "eval/accuracy" not in records[1]
    for r in records[1:]:
        assert r["rollout/judge_rule_compared"] == r["rollout/samples"]
        agreement = r["rollout/judge_rule_agreement"]
        assert agreement is not None and 0.0 <= agreement <= 1.0
    for e in evals:
        assert e["eval/judge_rule_compared"] == e["eval/samples"]

    console = Console(record=True, width=200)
    render_summary(history, mode="colocate", console=console, evals=evals)
    text = console.export_text()
    assert "judge=mv" in text
    assert "eval before training" in text and "eval after step 2" in text
    assert "judge agrees with math-verify" in text


def test_embedded_judge_is_base_plus_adapter_and_the_policy_the_base(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The demo preset: the judge instance says ``embedded`` (its engine merges the shipped
    adapter); the rollout engines get the resolved base folder, which has no adapter."""
    from genrm_serve import models
    from rl_core import launch
    from rl_core.config import parse_train_args
    from rl_core.specs import judge_specs, rollout_spec

    base = tmp_path / "gemma3-270m"
    monkeypatch.setattr(launch, "resolve_model_path", lambda path: base)  # no conversion here
    cfg = parse_train_args(["--preset", "cpu-demo", "--run-dir", str(tmp_path / "run")])
    policy_path = launch.resolve_model(cfg.hf_checkpoint)
    assert policy_path == str(base)

    (judge,) = judge_specs(cfg).values()
    assert models.is_embedded(judge.model_path) and judge.engine_config.adapter_path is None
    assert models.resolve_adapter(judge.model_path, judge.engine_config.adapter_path) == (
        models.shipped_adapter_dir()
    )
    rollout = rollout_spec(cfg, policy_path, "hf")
    assert rollout.model_path == str(base)
    assert models.resolve_adapter(rollout.model_path, rollout.engine_config.adapter_path) is None
