"""Per-module agentic judges: routing by module, aggregation, unmapped modules named."""

import pytest
from rewards_doubles import Args, JudgeDouble, Sample

from genrm_client import GenRMTimeoutError
from genrm_rewards import RewardConfigError, RewardInputError
from genrm_rewards.agentic import compute_score

ROUTES = {"plan": "planner_judge", "tool_call": "tool_judge", "final_answer": "final_judge"}
STEPS = [
    {"module": "plan", "output": "search, then compute"},
    {"module": "tool_call", "input": "search('6*7')", "output": "42"},
    {"module": "final_answer", "output": "Answer: 42"},
]
VERDICTS = {"planner_judge": "1", "tool_judge": "0", "final_judge": "1"}


def trajectory(steps: list[dict[str, str]] = STEPS) -> Sample:
    return Sample(response="", metadata={"question": "6*7?", "trajectory_steps": steps})


@pytest.mark.parametrize(("aggregation", "score"), [("mean", 2 / 3), ("min", 0.0), ("last", 1.0)])
async def test_aggregation(aggregation: str, score: float) -> None:
    judge = JudgeDouble(lambda m, r: VERDICTS[r or ""])
    args = Args(agentic_route_keys=ROUTES, agentic_aggregation=aggregation)
    result = await compute_score(args, trajectory(), client=judge)
    assert result["status"] == "ok"
    assert result["score"] == pytest.approx(score)
    assert judge.batch_calls == 1
    routes = [r for _, r, _ in judge.calls]
    assert routes == (["final_judge"] if aggregation == "last" else list(ROUTES.values()))
    assert [s["route_key"] for s in result["details"]["steps"]] == routes


async def test_unmapped_module_is_named_before_any_call() -> None:
    judge = JudgeDouble("1")
    steps = [*STEPS, {"module": "reflection", "output": "ok"}]
    with pytest.raises(RewardInputError, match=r"'reflection'.*agentic_route_keys"):
        await compute_score(Args(agentic_route_keys=ROUTES), trajectory(steps), client=judge)
    assert judge.calls == []


async def test_empty_mapping_and_bad_trajectory() -> None:
    with pytest.raises(RewardConfigError, match="agentic_route_keys is empty"):
        await compute_score(Args(), trajectory(), client=JudgeDouble())
    with pytest.raises(RewardInputError, match="non-empty list"):
        await compute_score(Args(agentic_route_keys=ROUTES), trajectory([]), client=JudgeDouble())
    with pytest.raises(RewardInputError, match=r"\[0\] \(module 'plan'\) has no 'output'"):
        await compute_score(
            Args(agentic_route_keys=ROUTES), trajectory([{"module": "plan"}]), client=JudgeDouble()
        )


async def test_failed_step_is_judge_error() -> None:
    judge = JudgeDouble(lambda m, r: GenRMTimeoutError("slow") if r == "tool_judge" else "1")
    result = await compute_score(Args(agentic_route_keys=ROUTES), trajectory(), client=judge)
    assert (result["status"], result["score"]) == ("judge_error", None)
    assert "tool_judge" in result["error"]
    assert [s["status"] for s in result["details"]["steps"]] == ["ok", "judge_error", "ok"]
