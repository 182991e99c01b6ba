"""The SGLang engine: argument mapping, sampling mapping and lifecycle, against a fake SGLang.

SGLang cannot run here (it needs a GPU and its own environment), so ``FakeSGLangEngine`` stands
in for ``sglang.Engine``; ``test_engine_sglang_behaviour.py`` checks each SGLang behaviour the
engine must cope with, ``test_engine_sglang_gpu.py`` runs the real thing where it exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines import make_engine
from genrm_serve.engines.base import EngineAsleepError, EngineError, EngineRequest
from genrm_serve.engines.sglang import (
    SGLangEngine,
    import_sglang_engine,
    sglang_engine_kwargs,
    sglang_sampling_params,
)
from genrm_serve.testing import FakeSGLangEngine, build_tiny_model


def _spec(per_engine: int = 1, model_path: str = "/m", **engine_config: object) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=model_path,
        num_gpus=per_engine,
        num_gpus_per_engine=per_engine,
        engine="sglang",
        engine_config=EngineConfig(**engine_config),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("per_engine", "engine_config", "expected"),
    [
        pytest.param(1, {}, {"tp_size": 1, "pp_size": 1, "dp_size": 1}, id="defaults"),
        pytest.param(4, {"pp_size": 2}, {"tp_size": 2, "pp_size": 2}, id="tp-times-pp"),
        pytest.param(
            8,
            {"dp_size": 4, "ep_size": 8, "enable_dp_attention": True},
            {"tp_size": 8, "dp_size": 4, "ep_size": 8, "enable_dp_attention": True},
            id="dp-attention-and-ep",
        ),
        pytest.param(
            1,
            {"deterministic_inference": True},
            {"enable_deterministic_inference": True},
            id="deterministic",
        ),
        pytest.param(
            2,
            {"mem_fraction_static": 0.4, "max_context_len": 4096, "dtype": "bfloat16"},
            {"mem_fraction_static": 0.4, "context_length": 4096, "dtype": "bfloat16"},
            id="memory-context-dtype",
        ),
    ],
)
def test_engine_kwargs(per_engine: int, engine_config: dict[str, object], expected: dict) -> None:  # type: ignore[type-arg]
    kwargs = sglang_engine_kwargs(_spec(per_engine, **engine_config), model_path="/m")
    assert kwargs["model_path"] == "/m" and kwargs["enable_memory_saver"] is True
    assert kwargs["enable_weights_cpu_backup"] is True  # a judge's weights survive sleep
    for key, value in expected.items():
        assert kwargs[key] == value, key
    if "mem_fraction_static" not in engine_config:
        assert "mem_fraction_static" not in kwargs  # SGLang's own default


@pytest.mark.parametrize(
    ("per_engine", "engine_config", "message"),
    [
        pytest.param(3, {"pp_size": 2}, "multiple of pp_size=2", id="pp-does-not-divide"),
        pytest.param(
            4,
            {"dp_size": 3, "enable_dp_attention": True},
            "dp_size=3 must divide",
            id="dp-does-not-divide",
        ),
        pytest.param(
            4, {"dp_size": 2}, "dp_size=2 needs enable_dp_attention=true", id="dp-without-dpa"
        ),
        pytest.param(4, {"enable_dp_attention": True}, "needs dp_size > 1", id="dpa-without-dp"),
        pytest.param(2, {"ep_size": 4}, "ep_size=4 must divide", id="ep-too-large"),
    ],
)
def test_engine_kwargs_errors(
    per_engine: int, engine_config: dict[str, object], message: str
) -> None:
    with pytest.raises(EngineError, match=message) as info:
        sglang_engine_kwargs(_spec(per_engine, **engine_config), model_path="/m")
    assert "judge" in str(info.value)


def test_sampling_params_mapping() -> None:
    sampling = SamplingParams(temperature=0.5, top_p=0.9, top_k=-1, stop=["</s>"], seed=5)
    assert sglang_sampling_params(sampling, 7, deterministic=True) == {
        "max_new_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": -1,
        "stop": ["</s>"],
        "sampling_seed": 5,
    }
    greedy = SamplingParams(temperature=0.0, top_k=3, seed=5)  # greedy: a seed changes nothing
    assert sglang_sampling_params(greedy, 1) == {
        "max_new_tokens": 1,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 3,
    }


def test_missing_sglang_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(ImportError, match="separate GPU environment"):
        import_sglang_engine()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _req(text: str, **sampling: object) -> EngineRequest:
    return EngineRequest(
        sampling=SamplingParams(**sampling).merged_over(DEFAULT_SAMPLING),  # type: ignore[arg-type]
        messages=[Message(role="user", content=text)],
        return_tokens=True,
    )


async def test_lifecycle_calls_sglang_in_the_documented_order(tiny_dir: Path) -> None:
    engine = SGLangEngine(_spec(model_path=str(tiny_dir)), "judge/0", engine_cls=FakeSGLangEngine)
    await engine.start()
    fake: FakeSGLangEngine = engine.sgl
    expected = sglang_engine_kwargs(engine.spec, model_path=str(tiny_dir))
    expected["context_length"] = 4096  # the default 8192, capped at the tiny model's positions
    assert {k: fake.server_args[k] for k in expected} == expected
    out = (await engine.generate([_req("hello", max_response_len=2)]))[0]
    assert (out.completion_tokens, out.finish_reason) == (2, "length")
    assert out.logprobs == [-0.25, -0.5] and len(out.token_ids or []) == 2
    assert out.prompt_tokens == len(engine.prompts.encode(_req("hello")))  # type: ignore[union-attr]

    await engine.sleep()
    assert fake.calls[-2:] == ["flush_cache", "release_memory_occupation"]
    assert fake.released == {"weights", "kv_cache", "cuda_graph"}
    n_calls = len(fake.calls)
    await engine.sleep()  # idempotent: nothing more reaches SGLang
    assert len(fake.calls) == n_calls
    n_calls = len(fake.calls)
    with pytest.raises(EngineAsleepError):
        await engine.generate([_req("hello")])
    with pytest.raises(EngineAsleepError):
        await engine.update_weights({"w": torch.zeros(1)}, version=1)
    assert len(fake.calls) == n_calls  # refused before SGLang could crash on them

    await engine.wake()
    # the weights are back, then the wake check's probe ran on them
    assert fake.calls[-2:] == ["resume_memory_occupation", "async_generate"] and not fake.released
    await engine.update_weights({"model.embed_tokens.weight": torch.zeros(1)}, version=1)
    assert fake.weight_names == ["model.embed_tokens.weight"]
    assert (await engine.generate([_req("x")]))[0].weight_version == 1
    await engine.shutdown()
    assert fake.calls[-1] == "shutdown"


def test_make_engine_builds_sglang() -> None:
    assert isinstance(make_engine(_spec(), "judge/0"), SGLangEngine)


@pytest.mark.parametrize(
    ("model_path", "engine_config"),
    [
        pytest.param("tiny", {"adapter_path": "ADAPTER"}, id="explicit-adapter"),
        pytest.param("embedded", {}, id="embedded-judge-adapter"),
    ],
)
async def test_an_adapter_is_refused_not_dropped(
    tiny_dir: Path, tmp_path: Path, model_path: str, engine_config: dict[str, str]
) -> None:
    """SGLang does not apply the adapter: serving the bare base instead would be silent."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    config = {k: str(adapter) if v == "ADAPTER" else v for k, v in engine_config.items()}
    path = str(tiny_dir) if model_path == "tiny" else model_path
    engine = SGLangEngine(_spec(model_path=path, **config), "judge/0", engine_cls=FakeSGLangEngine)
    with pytest.raises(EngineError, match="applied by the hf engine only"):
        await engine.start()
