"""One contract for every engine: the real hf engine, the SGLang engine over the fake SGLang (in
CI), and the SGLang engine over the real one (where SGLang and a CUDA GPU are present; this
machine's server arguments from ``GENRM_TEST_SGLANG_SERVER_ARGS``)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.hf import HFEngine
from genrm_serve.engines.sglang import SGLangEngine
from genrm_serve.testing import FakeSGLangEngine, build_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _real_sglang() -> bool:
    if importlib.util.find_spec("sglang") is None or importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _make(kind: str, model_dir: Path) -> Engine:
    config: dict[str, object] = {"max_context_len": 64}
    if kind == "sglang-real":
        config["mem_fraction_static"] = 0.2
        config["server_args"] = json.loads(os.environ.get("GENRM_TEST_SGLANG_SERVER_ARGS", "{}"))
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=1,
        engine="hf" if kind == "hf" else "sglang",
        engine_config=EngineConfig(**config),  # type: ignore[arg-type]
    )
    if kind == "hf":
        return HFEngine(spec, "judge/0")
    if kind == "sglang-real":
        return SGLangEngine(spec, "judge/0")
    return SGLangEngine(spec, "judge/0", engine_cls=FakeSGLangEngine)


def _req(text: str, tokens: bool = False, **sampling: object) -> EngineRequest:
    return EngineRequest(
        sampling=SamplingParams(**sampling).merged_over(DEFAULT_SAMPLING),  # type: ignore[arg-type]
        messages=[Message(role="system", content="judge"), Message(role="user", content=text)],
        return_tokens=tokens,
    )


@pytest.mark.parametrize(
    "kind",
    [
        "hf",
        "sglang-fake",
        pytest.param(
            "sglang-real",
            marks=pytest.mark.skipif(not _real_sglang(), reason="needs SGLang and a CUDA GPU"),
        ),
    ],
)
async def test_engine_contract(kind: str, tiny_dir: Path) -> None:
    engine = _make(kind, tiny_dir)
    assert engine.state == "created"
    await engine.start()
    assert engine.state == "awake"
    await engine.check_health()

    outs = await engine.generate(
        [_req("Is 2 = 2?", max_response_len=3), _req("Is 7 = 8?", True, max_response_len=4)]
    )
    assert len(outs) == 2
    for out, limit in zip(outs, (3, 4), strict=True):
        assert isinstance(out.text, str)
        assert out.finish_reason in {"stop", "length"}
        assert 0 < out.prompt_tokens <= 64 and 0 <= out.completion_tokens <= limit
        assert out.extra["engine_id"] == "judge/0" and out.extra["route_key"] == "judge"
    assert outs[0].token_ids is None
    tokens = outs[1]
    assert tokens.token_ids is not None and tokens.logprobs is not None
    assert len(tokens.token_ids) == len(tokens.logprobs) == tokens.completion_tokens
    assert all(lp <= 0 for lp in tokens.logprobs)

    with pytest.raises(PromptTooLongError):
        await engine.generate([_req("word " * 100)])

    await engine.sleep()
    assert engine.state == "asleep"
    with pytest.raises(EngineAsleepError):
        await engine.generate([_req("x")])
    await engine.wake()
    assert engine.state == "awake"
    assert len(await engine.generate([_req("x", max_response_len=2)])) == 1
    assert engine.stats()["state"] == "awake"
    await engine.shutdown()
