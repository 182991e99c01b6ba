"""``RecoverableEngine``: a rollout engine whose actor died is re-created once, brought to the old
one's weights and sleep state, and the calls that met the death are made again (no Ray here)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from genrm_serve import EngineFailedError, EngineGoneError
from rl_core.engine_recovery import RecoverableEngine, engine_restarts


class FakeEngine:
    """The calls ``RecoverableEngine`` makes of a ``RemoteEngine``; ``dead`` ones raise."""

    def __init__(self, name: str = "rollout-0") -> None:
        self.name, self.dead, self.version, self.asleep = name, False, 0, False
        self.failed, self.killed = False, False
        self.calls: list[str] = []

    def _check(self, what: str) -> None:
        self.calls.append(what)
        if self.dead:
            raise EngineGoneError(self.name, RuntimeError("killed by ray.kill"))
        if self.failed:
            raise EngineFailedError(f"engine {self.name}: wake check failed")

    async def kill(self) -> None:
        self.killed = True

    async def generate_many(self, requests: list[Any]) -> list[str]:
        await asyncio.sleep(0.01)
        self._check("generate_many")
        return [f"out-{r}" for r in requests]

    async def update_weights(self, weights: Any, version: int) -> int:
        self._check("update_weights")
        self.version = version
        return version

    async def weight_version(self, *, timeout_s: float | None = None) -> int:
        self._check("weight_version")
        return self.version

    async def sleep(self) -> None:
        self._check("sleep")
        self.asleep = True

    async def wake(self) -> None:
        self._check("wake")
        self.asleep = False


async def test_calls_that_meet_one_death_share_one_recreation() -> None:
    old, made = FakeEngine(), []

    async def factory(attempt: int) -> Any:
        made.append(attempt)
        new = FakeEngine()
        return new

    engine = RecoverableEngine(old, factory)  # type: ignore[arg-type]
    engine.weights = lambda: asyncio.sleep(0, "weights-v3")
    await engine.update_weights("w", 3)
    old.dead = True
    outs = await asyncio.gather(*(engine.generate_many([i, i + 1]) for i in range(3)))
    assert outs == [[f"out-{i}", f"out-{i + 1}"] for i in range(3)]  # every request once
    assert made == [1] and engine.restarts == 1 and engine_restarts([engine]) == 1
    new = engine.engine
    assert new is not old and new.version == 3  # type: ignore[attr-defined]
    assert new.calls[:2] == ["update_weights", "weight_version"]  # type: ignore[attr-defined]


async def test_a_sleeping_engine_comes_back_asleep() -> None:
    old = FakeEngine()
    engine = RecoverableEngine(old, lambda attempt: asyncio.sleep(0, FakeEngine()))  # type: ignore[arg-type]
    engine.weights = lambda: asyncio.sleep(0, None)
    await engine.sleep()
    old.dead = True
    await engine.wake()  # re-created asleep, then woken by the call itself
    assert engine.engine.calls == ["sleep", "wake"]  # type: ignore[attr-defined]


async def test_without_a_weight_source_a_death_is_raised() -> None:
    old = FakeEngine()
    old.dead = True
    engine = RecoverableEngine(old, lambda attempt: asyncio.sleep(0, FakeEngine()))  # type: ignore[arg-type]
    with pytest.raises(EngineGoneError):
        await engine.generate_many([1])
    assert engine.restarts == 0


async def test_an_engine_that_failed_its_wake_check_is_ended_and_replaced() -> None:
    old, made = FakeEngine(), []

    async def factory(attempt: int) -> Any:
        made.append(attempt)
        return FakeEngine()

    engine = RecoverableEngine(old, factory)  # type: ignore[arg-type]
    engine.weights = lambda: asyncio.sleep(0, "weights-v2")
    await engine.update_weights("w", 2)
    await engine.sleep()
    old.failed = True  # alive, but its weights did not survive the sleep
    await engine.wake()
    assert old.killed and made == [1] and engine.restarts == 1
    new = engine.engine
    assert new.version == 2 and not new.asleep  # type: ignore[attr-defined]
    assert new.calls == ["update_weights", "weight_version", "sleep", "wake"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "cause",
    [
        "The actor died because its node has died. Node Id: 5a1f",
        "unavailable",  # Ray cannot reach it yet: the node is not declared dead for seconds
    ],
    ids=["node-died", "unreachable"],
)
async def test_an_engine_lost_with_its_node_is_not_recreated_in_place(cause: str) -> None:
    """Its bundle went with the node (and the trainer ranks there): re-creating it there would
    wait for a bundle that is gone; the death is raised, and the run restarts."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    err: BaseException = (
        ActorUnavailableError("The actor is temporarily unavailable", None)
        if cause == "unavailable"
        else RayActorError(error_msg=cause)
    )

    class NodeGone(FakeEngine):
        def _check(self, what: str) -> None:
            raise EngineGoneError(self.name, err)

    made: list[int] = []

    async def factory(attempt: int) -> Any:
        made.append(attempt)
        return FakeEngine()

    engine = RecoverableEngine(NodeGone(), factory)  # type: ignore[arg-type]
    engine.weights = lambda: asyncio.sleep(0, None)
    with pytest.raises(EngineGoneError) as raised:
        await engine.generate_many([1])
    assert raised.value.cause is err and made == [] and engine.restarts == 0
