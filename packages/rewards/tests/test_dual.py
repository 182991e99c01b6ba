"""Dual judges: both called concurrently, combined by the configured rule, failures kept apart."""

import pytest
from rewards_doubles import Args, JudgeDouble, Sample, prompt_text

from genrm_client import GenRMError, GenRMOverloadedError
from genrm_rewards import get_reward_fn
from genrm_rewards.dual import compute_score


def by_route(quality: str | GenRMError, safety: str | GenRMError) -> JudgeDouble:
    return JudgeDouble(lambda m, r: {"quality": quality, "safety": safety}[r or ""])


SAMPLE = Sample(response="Step... Answer: 42", label="42", metadata={"question": "6*7?"})


@pytest.mark.parametrize(
    ("combine", "quality", "safety", "score"),
    [
        ("product", "1", "1", 1.0),
        ("product", "1", "0", 0.0),
        ("min", "0", "1", 0.0),
        ("weighted_sum", "1", "0", 0.7),
        ("weighted_sum", "0", "1", 0.3),
    ],
)
async def test_combination(combine: str, quality: str, safety: str, score: float) -> None:
    args = Args(dual_combine=combine, dual_weights=(0.7, 0.3))
    result = await compute_score(args, SAMPLE, client=by_route(quality, safety))
    assert result["status"] == "ok"
    assert result["score"] == pytest.approx(score)
    assert result["details"]["quality"]["score"] == float(quality)
    assert result["details"]["safety"]["score"] == float(safety)


async def test_both_routes_called_concurrently() -> None:
    judge = JudgeDouble("1", delay_s=0.05)
    await compute_score(Args(), SAMPLE, client=judge)
    assert judge.max_in_flight == 2
    assert sorted(r or "" for _, r, _ in judge.calls) == ["quality", "safety"]


async def test_either_failure_is_judge_error_with_both_parts() -> None:
    judge = by_route("1", GenRMOverloadedError("503 after retries", status=503))
    result = await compute_score(Args(), SAMPLE, client=judge)
    assert (result["status"], result["score"]) == ("judge_error", None)
    assert "safety" in result["error"] and "GenRMOverloadedError" in result["error"]
    assert result["details"]["quality"]["score"] == 1.0


async def test_unparsed_part_makes_unparsed() -> None:
    result = await compute_score(Args(), SAMPLE, client=by_route("1", "Safe."))
    assert (result["status"], result["score"]) == ("unparsed", 0.0)


async def test_safety_sees_whole_response_quoted_and_custom_routes() -> None:
    judge = JudgeDouble("1")
    args = Args(dual_quality_route_key="q", dual_safety_route_key="s")
    await get_reward_fn("dual-genrm")(args, SAMPLE, client=judge)  # type: ignore[call-arg]
    safety = next(m for m, r, _ in judge.calls if r == "s")
    assert "| Step... Answer: 42" in prompt_text(safety)


async def test_reference_free_quality_when_no_label() -> None:
    judge = JudgeDouble("1")
    await compute_score(
        Args(), Sample(response="Paris.", prompt="Capital of France?"), client=judge
    )
    quality = next(m for m, r, _ in judge.calls if r == "quality")
    assert "answers the question correctly" in prompt_text(quality)


async def test_a_groups_requests_share_a_prefix_key_per_judge() -> None:
    judge = JudgeDouble("1")
    for answer in ["Answer: 42", "Answer: 41", "I refuse."]:  # one prompt, three responses
        await compute_score(Args(), Sample(response=answer, label="42"), client=judge)
    by_route: dict[str | None, set[str | None]] = {}
    for (_, route, _), key in zip(judge.calls, judge.prefix_keys, strict=True):
        by_route.setdefault(route, set()).add(key)
    assert set(by_route) == {"quality", "safety"}
    assert all(len(keys) == 1 and None not in keys for keys in by_route.values())
    assert by_route["quality"] != by_route["safety"]
    await compute_score(Args(), Sample(response="Answer: 42", label="7"), client=judge)
    assert judge.prefix_keys[-2:].count(next(iter(by_route["safety"]))) == 1  # same question
    assert next(iter(by_route["quality"])) not in judge.prefix_keys[-2:]  # other reference
