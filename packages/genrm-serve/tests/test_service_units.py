"""The service's pure parts outside the router: health bodies, request mapping, building the app.

No Ray here: routers are built over engine slots without actors, which is all that health needs
(it reads slot state, never calls an engine).
"""

from __future__ import annotations

import pytest

from genrm_serve.app import build_app
from genrm_serve.config import GenRMConfigError, build_instances
from genrm_serve.engine_refs import EngineRef, instance_bundles, normalize_engines
from genrm_serve.health import health_report
from genrm_serve.openai_compat import ChatCompletionRequest
from genrm_serve.router import EngineSlot, InstanceRouter


def _router(key: str = "q", engines: int = 2) -> InstanceRouter:
    """An instance whose engines all serve (slots without actors: health reads only state)."""
    spec = build_instances(instances={key: {"model_path": "scripted", "num_gpus": engines}})[key]
    slots = [EngineSlot(key, i, EngineRef(), state="healthy") for i in range(engines)]
    return InstanceRouter(spec, slots, inflight_limit=2, request_timeout_s=5.0)


# ---- health ----------------------------------------------------------------------------------


def test_health_body_with_one_healthy_instance_is_exact() -> None:
    assert health_report({"q": _router()}) == (200, {"status": "healthy", "service": "genrm"})


def test_health_body_with_several_instances_lists_them() -> None:
    status, body = health_report({"a": _router("a"), "b": _router("b")})
    assert status == 200
    assert body["instances"] == {"a": {"status": "healthy"}, "b": {"status": "healthy"}}


def test_one_engine_down_is_503_degraded_with_detail() -> None:
    r = _router()
    r.set_state(r.slots[1], "dead", "actor died: boom")
    status, body = health_report({"q": r})
    assert status == 503
    assert body["status"] == "unhealthy"
    q = body["instances"]["q"]
    assert q["status"] == "degraded" and q["engines_healthy"] == 1 and q["engines_total"] == 2
    assert "q/1: dead (actor died: boom)" in q["detail"]


def test_an_asleep_instance_is_healthy_but_says_so() -> None:
    r = _router()
    r.asleep = True
    status, body = health_report({"q": r})
    assert status == 200
    assert body["instances"]["q"]["status"] == "asleep"


# ---- request mapping -------------------------------------------------------------------------


def test_openai_request_maps_to_messages_and_sampling() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "q",
            "messages": [
                {"role": "developer", "content": "be strict"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
            "max_completion_tokens": 3,
            "stop": "\n",
            "top_k": 5,
        }
    )
    msgs = req.chat_messages()
    assert [(m.role, m.content) for m in msgs] == [("system", "be strict"), ("user", "ab")]
    sp = req.sampling_params()
    assert (sp.max_response_len, sp.stop, sp.top_k) == (3, ["\n"], 5)


@pytest.mark.parametrize(
    "extra", [{"n": 2}, {"stream": True}, {"tools": []}], ids=["n", "stream", "tools"]
)
def test_openai_request_refuses_what_a_judge_cannot_honour(extra: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ChatCompletionRequest.model_validate(
            {"model": "q", "messages": [{"role": "user", "content": "x"}], **extra}
        )


# ---- building the app ------------------------------------------------------------------------


def test_engines_for_an_unknown_instance_are_refused() -> None:
    instances = build_instances(instances={"q": {"model_path": "scripted", "num_gpus": 2}})
    with pytest.raises(GenRMConfigError, match="route_key='x'"):
        normalize_engines(instances, {"x": ["some-actor"]})
    refs = normalize_engines(instances, {"q": ["named-actor", EngineRef(name="b")]})
    assert [r.name for r in refs["q"]] == ["named-actor", "b"]
    with pytest.raises(GenRMConfigError, match="no instance"):
        build_app({})


def test_bundles_ask_for_gpus_only_on_a_gpu_cluster() -> None:
    spec = build_instances(
        instances={"q": {"model_path": "m", "num_gpus": 4, "num_gpus_per_engine": 2}}
    )["q"]
    assert (
        instance_bundles(spec, with_gpus=True, engine_num_cpus=1.0)
        == [{"CPU": 1.0, "GPU": 2.0}] * 2
    )
    assert instance_bundles(spec, with_gpus=False, engine_num_cpus=0.5) == [{"CPU": 0.5}] * 2
