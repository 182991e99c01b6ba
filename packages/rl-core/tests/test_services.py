"""Starting a run's services, without Ray: start-up steps together and one after another, each
timed by the run's clock."""

import asyncio

import pytest

from rl_core.metrics import PhaseClock
from rl_core.services import start_in_turn, start_together


async def test_a_failed_start_up_step_is_the_error_and_stops_the_others():
    """Steps started together: the first failure is what the user sees (not an exception group)
    and the others are cancelled; one after another, a failure leaves the rest unstarted."""
    events = []
    clock = PhaseClock(show=False)

    async def fails():
        await asyncio.sleep(0.01)
        raise RuntimeError("judge engine 0 did not start: out of memory")

    async def slow():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    startup = {}
    with pytest.raises(RuntimeError, match="did not start: out of memory"):
        await start_together({"judge_service": fails(), "rollout_engines": slow()}, clock, startup)
    assert events == ["cancelled"] and set(startup) == {"judge_service", "rollout_engines"}

    async def ok():
        events.append("ran")
        return 1

    events.clear()
    with pytest.raises(RuntimeError, match="out of memory"):
        await start_in_turn({"rollout_engines": fails(), "judge_service": ok()}, clock, {})
    assert events == []  # never started, and closed (no "never awaited" warning)
    assert await start_in_turn({"a": ok(), "b": ok()}, clock, {}) == {"a": 1, "b": 1}
