"""``rl-core train`` end to end with ``--rm-type rubric-genrm`` and a judge panel: local Ray, the
judge service with two scripted test engines behind real Ray Serve + HTTP, the hf engine as the
rollout engine (tiny random model), two GRPO steps.

The judges have known preferences: ``strict`` says 1 only when a quoted response line starts
with a vowel or a digit, ``kind`` always says 1 but fails every question about the criterion
"Is sparkly" (one request per engine batch, so a failure takes no other question along). With
``--judge-panel-quorum 1`` that criterion is judged by ``strict`` alone; every other criterion
by both, averaged. So every reward is known from the response, no sample is a judge error, and
the step reports the members' agreement on the questions both answered.
"""

import json

import pytest

from genrm_serve.testing import scripted_model_path
from rl_core.config import parse_train_args
from rl_core.launch import run_training
from rl_core.metrics import read_metrics

pytestmark = pytest.mark.slow

FIRST_CHARS = "aeiou0123456789"
FILE_RUBRIC = [{"criterion": "Is clear", "weight": 2}, {"criterion": "Is sparkly", "weight": 1}]
OWN_RUBRIC = [{"criterion": "Is kind", "weight": 1}, {"criterion": "Is sparkly", "weight": 3}]


def _expected(response: str, rubric: list[dict[str, object]]) -> float:
    """The reward the scripted panel gives ``response`` (see the module docstring)."""
    from genrm_rewards.quoting import quote_untrusted

    block, _ = quote_untrusted(response, tag="RESPONSE", max_chars=8000)
    strict = 1.0 if any(f"| {c}" in block for c in FIRST_CHARS) else 0.0
    total = sum(float(c["weight"]) for c in rubric)  # type: ignore[arg-type]
    score = 0.0
    for c in rubric:
        verdict = strict if c["criterion"] == "Is sparkly" else (strict + 1.0) / 2
        score += float(c["weight"]) * verdict  # type: ignore[arg-type]
    return score / total


async def test_rubric_with_a_panel_trains_two_steps(
    tmp_path, monkeypatch, tiny_run_flags, shared_ray
):
    from genrm_serve.testing import build_tiny_model

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    model = build_tiny_model(tmp_path / "policy")
    data = tmp_path / "train.jsonl"
    records = [
        {"prompt": f"Write a greeting number {i}:", "label": "", "metadata": {"id": f"g{i}"}}
        for i in range(4)
    ]
    for r in records[::2]:  # half carry their own rubric, the rest use the run's file
        r["metadata"]["rubric"] = OWN_RUBRIC
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    rubric = tmp_path / "rubric.json"
    rubric.write_text(json.dumps(FILE_RUBRIC))
    replies = {f"| {c}": "1" for c in FIRST_CHARS}
    judges = {
        "strict": {
            "model_path": scripted_model_path(default="0", replies=replies),
            "num_gpus": 1,
            "engine": "scripted",
        },
        "kind": {
            "model_path": scripted_model_path(
                default="1", fail_when_contains="[Criterion]:\nIs sparkly"
            ),
            "num_gpus": 1,
            "engine": "scripted",
            "engine_config": {"max_batch_size": 1},
        },
    }
    monkeypatch.setenv("GENRM_MAX_RETRIES", "0")
    run = tmp_path / "run"
    cfg = parse_train_args(
        [
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--rm-type",
            "rubric-genrm",
            "--rubric-path",
            str(rubric),
            "--judge-panel",
            "strict,kind",
            "--judge-panel-quorum",
            "1",
            "--genrm-instances",
            json.dumps(judges),
            *tiny_run_flags,
            "--run-dir",
            str(run),
        ]
    )
    assert await run_training(cfg) == 0
    records_logged = read_metrics(run)
    assert [r["step"] for r in records_logged] == [1, 2]
    samples = [
        json.loads(line)
        for step in (1, 2)
        for line in (run / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 16
    for s in samples:
        assert s["status"] == "ok", s
        details = s["details"]["details"]
        own = details["rubric"] == "metadata['rubric']"
        rubric_used = OWN_RUBRIC if own else FILE_RUBRIC
        assert [c["criterion"] for c in details["criteria"]] == [
            c["criterion"] for c in rubric_used
        ]
        sparkly = next(c for c in details["criteria"] if c["criterion"] == "Is sparkly")
        assert sparkly["panel"]["kind"]["status"] == "judge_error"  # left out: quorum 1
        assert s["reward"] == pytest.approx(_expected(s["response"], rubric_used)), s
    assert {details["details"]["rubric"] for details in (s["details"] for s in samples)} == {
        "metadata['rubric']",
        f"rubric_path={str(rubric)!r}",
    }
    for r in records_logged:
        assert r["verdicts/judge"] == 8
        # one question per sample was answered by both members ("Is kind" / "Is clear")
        assert r["rollout/panel_compared/strict~kind"] == 8
        assert 0.0 <= r["rollout/panel_agreement/strict~kind"] <= 1.0
