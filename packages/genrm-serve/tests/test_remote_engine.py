"""RemoteEngine: every call to an engine actor has a deadline, a request is cancelled on the actor
when its caller gives up, a control call is not, and an actor's death is one typed error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError

import genrm_serve
from genrm_client.types import Message, SamplingParams
from genrm_serve import EngineGoneError, RemoteEngine
from genrm_serve.engines import remote as remote_module
from genrm_serve.engines.base import EngineAsleepError, EngineOutput, EngineRequest
from genrm_serve.router import error_message


class _Method:
    """``handle.<method>.remote(...)``: runs ``behaviour`` and records the calls."""

    def __init__(self, behaviour: Any) -> None:
        self.behaviour = behaviour
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def remote(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        self.calls.append((args, kwargs))

        async def run() -> Any:
            if isinstance(self.behaviour, BaseException):
                raise self.behaviour
            if isinstance(self.behaviour, float):
                await asyncio.sleep(self.behaviour)
                return None
            return self.behaviour

        return run()


class _Handle:
    def __init__(self, **methods: Any) -> None:
        for name, behaviour in methods.items():
            setattr(self, name, _Method(behaviour))


def _request() -> EngineRequest:
    return EngineRequest(
        sampling=SamplingParams(temperature=0.0), messages=[Message(role="user", content="x")]
    )


@pytest.fixture
def cancelled(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    refs: list[Any] = []
    monkeypatch.setattr(remote_module.ray, "cancel", refs.append)
    return refs


async def test_a_request_past_its_deadline_is_cancelled_on_the_actor(cancelled: list[Any]) -> None:
    engine = RemoteEngine(_Handle(generate_many=5.0), "q/0")
    with pytest.raises(TimeoutError):
        await engine.generate_many([_request()], timeout_s=0.05)
    assert len(cancelled) == 1


async def test_a_request_whose_caller_went_away_is_cancelled_on_the_actor(
    cancelled: list[Any],
) -> None:
    engine = RemoteEngine(_Handle(generate=5.0), "q/0")
    task = asyncio.ensure_future(engine.generate(_request(), timeout_s=10))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(cancelled) == 1


async def test_a_control_call_past_its_deadline_is_not_cancelled(cancelled: list[Any]) -> None:
    # cancelling a sleep half-way would leave the engine between awake and asleep
    engine = RemoteEngine(_Handle(sleep=5.0), "q/0")
    with pytest.raises(TimeoutError):
        await engine.sleep(timeout_s=0.05)
    assert cancelled == []


async def test_the_actors_deadline_applies_where_a_call_gives_none() -> None:
    engine = RemoteEngine(_Handle(wake=5.0, start=0.2), "rollout-0", timeout_s=0.05)
    with pytest.raises(TimeoutError):
        await engine.wake()
    # a start keeps its own (long) deadline: loading a model is not an ordinary call
    assert await engine.start() is None


@pytest.mark.parametrize(
    "death",
    [
        pytest.param(ActorDiedError(), id="died"),
        pytest.param(ActorUnavailableError("unreachable", None), id="unavailable"),
    ],
)
async def test_an_actors_death_is_one_typed_error_that_keeps_rays(death: BaseException) -> None:
    engine = RemoteEngine(_Handle(check_health=death), "q/1")
    with pytest.raises(EngineGoneError) as info:
        await engine.check_health()
    assert info.value.__cause__ is death and info.value.cause is death
    assert "q/1" in str(info.value)
    # the router and supervisor report Ray's own error, as before
    assert error_message(info.value).startswith(type(death).__name__)


async def test_the_engines_own_errors_pass_unchanged() -> None:
    asleep = EngineAsleepError("engine q/0 is asleep (wake it first)")
    engine = RemoteEngine(_Handle(generate_many=asleep), "q/0")
    with pytest.raises(EngineAsleepError):
        await engine.generate_many([_request()])


async def test_answers_come_back_typed() -> None:
    out = EngineOutput("A", "stop", prompt_tokens=1, completion_tokens=1)
    handle = _Handle(
        generate_many=[out],
        stats={"weight_version": 3, "state": "awake"},
        check_health=True,
        update_weights=3,
    )
    engine = RemoteEngine(handle, "rollout-0")
    assert await engine.generate_many([_request()], return_exceptions=True) == [out]
    assert handle.generate_many.calls[0][1] == {"return_exceptions": True}
    assert await engine.weight_version() == 3
    assert await engine.state() == "awake"
    assert await engine.check_health() is True
    assert await engine.update_weights({"w": 1}, 3) == 3


def test_the_old_name_engine_actor_still_imports() -> None:
    from genrm_serve import EngineActor

    assert EngineActor is RemoteEngine is genrm_serve.EngineActor
    assert "EngineActor" in genrm_serve.__all__ and "RemoteEngine" in genrm_serve.__all__
