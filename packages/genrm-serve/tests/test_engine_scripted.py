"""The scripted test engine: rules, limits, failure injection and lifecycle, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, InstanceSpec
from genrm_serve.engines import make_engine, resolve_engine_kind
from genrm_serve.engines.base import (
    EngineAsleepError,
    EngineError,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.scripted import ScriptedEngine, load_script, scripted_model_path


def _spec(model_path: str, route_key: str = "judge", **engine_config: int) -> InstanceSpec:
    return InstanceSpec(
        route_key=route_key,
        model_path=model_path,
        num_gpus=1,
        engine="scripted",
        engine_config=engine_config or {},  # type: ignore[arg-type]
    )


def _req(text: str, **sampling: object) -> EngineRequest:
    return EngineRequest(
        sampling=SamplingParams(**sampling).merged_over(DEFAULT_SAMPLING),  # type: ignore[arg-type]
        messages=[Message(role="system", content="judge"), Message(role="user", content=text)],
    )


async def _engine(model_path: str, **kw: int) -> ScriptedEngine:
    engine = make_engine(_spec(model_path, **kw), "judge/0")
    assert isinstance(engine, ScriptedEngine)
    await engine.start()
    return engine


async def test_rules_match_last_user_message_and_report_routing() -> None:
    script = {"default": "0", "replies": {"apple": "1", "pear": "from {route_key} {engine_id}"}}
    engine = await _engine("scripted:" + json.dumps(script))
    outs = await engine.generate([_req("an apple"), _req("a banana"), _req("one pear")])
    assert [o.text for o in outs] == ["1", "0", "from judge judge/0"]
    assert all(o.finish_reason == "stop" for o in outs)
    assert outs[0].extra["route_key"] == "judge" and outs[0].extra["engine_id"] == "judge/0"
    assert outs[0].prompt_tokens == 3  # "judge" + "an apple"


def test_scripted_model_path_is_the_inline_form_and_refuses_a_key_no_script_has() -> None:
    path = scripted_model_path(default="0", replies={"apple": "1"}, delay_s=0.5)
    assert path.startswith("scripted:{")
    assert resolve_engine_kind(_spec(path).model_copy(update={"engine": "auto"})) == "scripted"
    assert load_script(path).model_dump(include={"default", "replies", "delay_s"}) == {
        "default": "0",
        "replies": {"apple": "1"},
        "delay_s": 0.5,
    }
    with pytest.raises(ValueError, match="defualt"):
        scripted_model_path(defualt="1")
    with pytest.raises(ValueError, match="delay_s"):
        scripted_model_path(delay_s=-1)


async def test_default_reply_forms(tmp_path: Path) -> None:
    assert (await (await _engine("scripted")).generate([_req("x")]))[0].text == "1"
    assert (await (await _engine("scripted:yes sir")).generate([_req("x")]))[0].text == "yes sir"
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"default": "{last_user}!"}))
    assert (await (await _engine(str(path))).generate([_req("echo")]))[0].text == "echo!"


def test_bad_scripts_are_rejected_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="invalid JSON at line 1"):
        load_script("scripted:{nope")
    with pytest.raises(EngineError, match="bogus"):
        load_script('scripted:{"bogus": 1}')
    with pytest.raises(EngineError, match="neither"):
        load_script(str(tmp_path / "missing.json"))


async def test_stop_and_length_limits() -> None:
    engine = await _engine("scripted:one two three four")
    out = (await engine.generate([_req("x", max_response_len=2)]))[0]
    assert (out.text, out.finish_reason, out.completion_tokens) == ("one two", "length", 2)
    out = (await engine.generate([_req("x", stop=[" three"])]))[0]
    assert (out.text, out.finish_reason) == ("one two", "stop")


async def test_prompt_too_long_is_refused() -> None:
    engine = await _engine("scripted", max_context_len=4)
    with pytest.raises(PromptTooLongError) as info:
        await engine.generate([_req("a b c d e f")])
    assert (info.value.prompt_tokens, info.value.max_context_len) == (7, 4)
    assert engine.calls == 0  # refused before the call counted as work


async def test_failure_injection() -> None:
    engine = await _engine('scripted:{"fail_every": 3}')
    results = []
    for _ in range(6):
        try:
            await engine.generate([_req("x")])
            results.append("ok")
        except EngineError:
            results.append("fail")
    assert results == ["ok", "ok", "fail", "ok", "ok", "fail"]
    engine.set_fail_every(0)
    engine.set_failing(True, "disk on fire")
    with pytest.raises(EngineError, match="disk on fire"):
        await engine.generate([_req("x")])
    engine.set_failing(False)
    assert (await engine.generate([_req("x")]))[0].text == "1"
    engine.set_healthy(False)
    with pytest.raises(EngineError, match="unhealthy"):
        await engine.check_health()


async def test_sleep_wake_and_weight_versions() -> None:
    engine = await _engine("scripted")
    await engine.sleep()
    assert engine.state == "asleep"
    with pytest.raises(EngineAsleepError):
        await engine.generate([_req("x")])
    await engine.wake()
    await engine.update_weights({"w": 1}, version=2)
    with pytest.raises(EngineError, match="must be greater"):
        await engine.update_weights({"w": 1}, version=2)
    out = (await engine.generate([_req("x")]))[0]
    assert out.weight_version == 2


def test_auto_resolves_scripted_model_paths() -> None:
    spec = InstanceSpec(route_key="k", model_path="scripted:1", num_gpus=1)
    assert resolve_engine_kind(spec) == "scripted"
    other = spec.model_copy(update={"model_path": "/models/x"})
    assert resolve_engine_kind(other) in {"hf", "sglang"}
    assert resolve_engine_kind(other.model_copy(update={"engine": "hf"})) == "hf"


def _comparison(a: str, b: str) -> str:
    return (
        f"Which is better?\n[Response A]:\n<<<BEGIN RESPONSE A>>>\n| {a}\n<<<END RESPONSE A>>>\n"
        f"[Response B]:\n<<<BEGIN RESPONSE B>>>\n| {b}\n<<<END RESPONSE B>>>\nJudgement:"
    )


async def test_a_pairwise_judge_with_known_preferences_and_a_position_bias() -> None:
    fair = await _engine("scripted:" + json.dumps({"prefer": ["best", "good"], "default": "x"}))
    pairs = [("good", "best"), ("best", "good"), ("good", "meh"), ("meh", "good"), ("meh", "no")]
    outs = await fair.generate([_req(_comparison(a, b)) for a, b in pairs])
    assert [o.text for o in outs] == ["0", "1", "1", "0", "1"]  # a tie goes to A
    assert (await fair.generate([_req("no blocks here")]))[0].text == "x"
    biased = await _engine("scripted:" + json.dumps({"prefer": ["best", "good"], "first_bias": 1}))
    outs = await biased.generate([_req(_comparison(a, b)) for a, b in pairs])
    # one rank for free: A wins the close pairs in either order, the clear one still decides
    assert [o.text for o in outs] == ["1", "1", "1", "1", "1"]
    assert [o.text for o in await biased.generate([_req(_comparison("meh", "best"))])] == ["0"]
