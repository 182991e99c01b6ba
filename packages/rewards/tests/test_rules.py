"""The math-verify rule: correct verdicts, its own timeout, never blocking the event loop."""

import asyncio
import threading
import time

import pytest
from rewards_doubles import Args, Sample

from genrm_rewards import get_reward_fn, rules

CASES = [
    ("42", "42", True),
    ("\\frac{1}{2}", "0.5", True),
    ("0.5", "$\\boxed{\\frac{1}{2}}$", True),
    ("(x+1)^2", "x^2+2x+1", True),
    ("42", "41", False),
    ("42", "no idea", False),
]


@pytest.mark.parametrize(("gold", "pred", "equal"), CASES, ids=[f"{g}|{p}" for g, p, _ in CASES])
async def test_math_equal(gold: str, pred: str, equal: bool) -> None:
    assert await rules.math_equal(gold, pred, timeout_s=10) is equal


DECISIONS = [("42", "42", "equal"), ("42", "41", "not_equal"), ("42", "", "undecided")]


@pytest.mark.parametrize(("gold", "pred", "decision"), DECISIONS, ids=[d for *_, d in DECISIONS])
async def test_math_decide_says_why_and_math_equal_is_its_equal(
    gold: str, pred: str, decision: str
) -> None:
    assert await rules.math_decide(gold, pred, timeout_s=10) == decision
    assert await rules.math_equal(gold, pred, timeout_s=10) is (decision == "equal")
    assert rules.math_equal_sync(gold, pred) is (decision == "equal")


async def test_math_decide_reports_an_overrun_as_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    await rules.math_equal("1", "1", timeout_s=10)  # warm import

    def stuck(gold: str, pred: str) -> str:
        time.sleep(0.5)
        return "equal"

    monkeypatch.setattr(rules, "math_decide_sync", stuck)
    assert await rules.math_decide("1", "1", timeout_s=0.1) == "timeout"


async def test_math_reward_scores() -> None:
    math = get_reward_fn("math")
    right = await math(Args(), Sample(response="... Answer: \\boxed{204}", label="204"))
    wrong = await math(Args(), Sample(response="... Answer: 205", label="204"))
    assert (right["score"], right["status"]) == (1.0, "ok")
    assert (wrong["score"], wrong["status"]) == (0.0, "ok")


def test_works_off_the_main_thread() -> None:
    """math-verify's own signal timeouts would raise here; ours must not."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(asyncio.run(rules.math_equal("1/2", "0.5", timeout_s=10)))
        except Exception as err:
            out.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert out == [True]


async def test_timeout_reports_judge_error_without_blocking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await rules.math_equal("1", "1", timeout_s=10)  # warm import

    def stuck(gold: str, pred: str) -> bool:
        time.sleep(1.0)
        return True

    monkeypatch.setattr(rules, "math_equal_sync", stuck)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    result = await get_reward_fn("math")(
        Args(rule_timeout_s=0.2), Sample(response="Answer: 1", label="1")
    )
    task.cancel()
    assert (result["status"], result["score"]) == ("judge_error", None)
    assert "rule_timeout_s=0.2" in result["error"]
    assert ticks >= 5  # the event loop kept running meanwhile


async def test_queueing_for_a_worker_does_not_count_as_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GRPO group queues many checks at once; each gets its full timeout once it runs."""
    await rules.math_equal("1", "1", timeout_s=10)  # warm import

    def slowish(gold: str, pred: str) -> bool:
        time.sleep(0.15)
        return gold == pred

    monkeypatch.setattr(rules, "math_equal_sync", slowish)
    results = await asyncio.gather(*(rules.math_equal("1", "1", timeout_s=0.5) for _ in range(12)))
    assert results == [True] * 12  # 12 x 0.15 s on 2 workers is ~0.9 s > 0.5 s, yet no timeout
