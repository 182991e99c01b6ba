"""The transformers engine on a tiny random-weight model: prompts, limits, sampling, lifecycle,
and the weights' dtype on a CPU."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from genrm_client.types import Message, SamplingParams
from genrm_serve import precision
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import (
    EngineAsleepError,
    EngineBatchError,
    EngineError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.hf import HFEngine
from genrm_serve.engines.hf.engine import _resolve_dtype
from genrm_serve.precision import CpuBf16Probe
from genrm_serve.testing import build_tiny_model

SHARED = "You are a careful judge. Compare the answer with the reference answer. " * 6


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _unstarted(model_dir: Path, **engine_config: object) -> HFEngine:
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=1,
        engine="hf",
        # CPU tests on any host (a GPU one too), in fp32: on a CPU with native bf16 "auto" is
        # bf16, whose rounding would differ between a packed batch and a row alone. The GPU
        # paths: tests/test_gpu_engine.py
        engine_config=EngineConfig(  # type: ignore[arg-type]
            **{"device": "cpu", "dtype": "float32", **engine_config}
        ),
    )
    return HFEngine(spec, "judge/0")


def _engine(model_dir: Path, **engine_config: object) -> HFEngine:
    engine = _unstarted(model_dir, **engine_config)
    asyncio.run(engine.start())
    return engine


async def _aengine(model_dir: Path, **engine_config: object) -> HFEngine:
    engine = _unstarted(model_dir, **engine_config)
    await engine.start()
    return engine


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[HFEngine]:
    eng = _engine(tiny_dir)
    yield eng
    asyncio.run(eng.shutdown())


def _req(text: str, *, tokens: bool = False, **sampling: object) -> EngineRequest:
    params = {"temperature": 0.0, "max_response_len": 8, **sampling}
    return EngineRequest(
        sampling=SamplingParams(**params).merged_over(DEFAULT_SAMPLING),  # type: ignore[arg-type]
        messages=[Message(role="user", content=text)],
        return_tokens=tokens,
    )


async def _one(engine: HFEngine, request: EngineRequest) -> EngineOutput:
    return (await engine.generate([request]))[0]


async def _length_prompt(engine: HFEngine, n: int = 8) -> str:
    """A prompt whose greedy continuation runs ``n`` tokens without an end-of-sequence token."""
    for i in range(40):
        text = f"Problem {i}: what is {i} + {i}?"
        if (await _one(engine, _req(text, max_response_len=n))).finish_reason == "length":
            return text
    raise AssertionError("no prompt of the tiny model avoided EOS for 8 tokens")


async def test_chat_template_and_kwargs_are_applied(engine: HFEngine) -> None:
    plain = _req("Is 7 = 7?")
    no_think = _req("Is 7 = 7?", chat_template_kwargs={"enable_thinking": False})
    assert engine.render(plain).endswith("<|im_start|>assistant\n")
    assert engine.render(no_think).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    a, b = await engine.generate([plain, no_think])
    extra = len(engine.tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False).input_ids)
    assert b.prompt_tokens == a.prompt_tokens + extra
    assert a.prompt_tokens == len(engine.encode(plain))


def test_fallback_template_for_models_without_one(tiny_dir: Path, tmp_path: Path) -> None:
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny_dir, bare)
    (bare / "chat_template.jinja").unlink()
    eng = _engine(bare)
    text = eng.render(
        EngineRequest(
            sampling=DEFAULT_SAMPLING,
            messages=[
                Message(role="system", content="Judge."),
                Message(role="user", content="Is 1 = 1?"),
            ],
        )
    )
    assert text == "<bos>Judge.\n\nUser: Is 1 = 1?\n\nAssistant:"


async def test_a_batch_of_prompts_is_tokenized_as_each_alone(tiny_dir: Path) -> None:
    """One tokenizer call for a batch's chat prompts: the same ids as each request alone, the
    token-id requests as given, and an over-long prompt's refusal in its own place."""
    eng = await _aengine(tiny_dir, max_context_len=64)
    assert eng.prompts is not None
    requests = [
        _req(SHARED[:80] + " answer 1"),
        EngineRequest(sampling=DEFAULT_SAMPLING, prompt_token_ids=[5, 6, 7]),
        _req("far " * 40),
        _req("short"),
    ]
    many = eng.prompts.checked_many(requests)
    assert many[0] == eng.prompts.checked(requests[0])
    assert many[1] == [5, 6, 7]
    assert isinstance(many[2], PromptTooLongError) and many[2].prompt_tokens > 64
    assert many[3] == eng.prompts.checked(requests[3])


async def test_over_long_prompt_is_refused_alone_before_any_compute(tiny_dir: Path) -> None:
    eng = await _aengine(tiny_dir, max_context_len=24)
    before = dict(eng.counters)
    with pytest.raises(PromptTooLongError) as info:
        await eng.generate([_req("far " * 40)])
    assert info.value.max_context_len == 24 and info.value.prompt_tokens > 24
    assert eng.counters == before  # no forward pass ran
    with pytest.raises(EngineBatchError) as batch:
        await eng.generate([_req("short", max_response_len=1), _req("far " * 40)])
    short, refused = batch.value.results
    assert isinstance(refused, PromptTooLongError)
    assert isinstance(short, EngineOutput) and short.completion_tokens == 1
    # only the short neighbour's prompt went through the model
    assert eng.counters["forward_tokens"] - before["forward_tokens"] == short.prompt_tokens
    ok = await _one(eng, _req("short", max_response_len=100))
    assert ok.prompt_tokens + ok.completion_tokens <= 24  # generation stops at the context


async def test_greedy_is_deterministic_and_independent_of_the_batch(engine: HFEngine) -> None:
    target = _req("what is the sum of 3 and 4?")
    alone = await _one(engine, target)
    again = await _one(engine, target)
    batch = await engine.generate([_req("x"), target, _req("a much longer prompt " * 5)])
    assert alone.text == again.text == batch[1].text
    assert alone.completion_tokens > 0


async def test_stop_strings_and_length(engine: HFEngine) -> None:
    prompt = await _length_prompt(engine)
    full = await _one(engine, _req(prompt, tokens=True))
    assert (full.finish_reason, full.completion_tokens) == ("length", 8)
    short = await _one(engine, _req(prompt, tokens=True, max_response_len=3))
    assert (short.finish_reason, short.completion_tokens) == ("length", 3)
    assert short.token_ids == full.token_ids[:3]  # type: ignore[index]
    stop = full.text.strip()[1:3]
    assert stop, full.text
    stopped = await _one(engine, _req(prompt, stop=[stop]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.find(stop)]
    assert stopped.completion_tokens < 8


async def test_logprobs_match_a_forward_pass(engine: HFEngine) -> None:
    temperature = 0.7
    req = _req("Problem: 3 + 4 = ?", tokens=True, temperature=temperature, seed=3)
    out = await _one(engine, req)
    assert out.token_ids is not None and out.logprobs is not None and out.raw_logprobs is not None
    assert len(out.token_ids) == len(out.logprobs) == out.completion_tokens > 0
    assert all(lp <= 0.0 for lp in out.logprobs + out.raw_logprobs)
    prompt = engine.encode(req)
    ids = torch.tensor([prompt + out.token_ids], device=engine.device)
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().cpu()
    picked = torch.tensor(out.token_ids).unsqueeze(1)
    scaled = torch.log_softmax(logits / temperature, -1).gather(1, picked).squeeze(1)
    raw = torch.log_softmax(logits, -1).gather(1, picked).squeeze(1)
    # KV-cached decoding vs one full forward: equal in fp32, close in bf16 (CUDA's default)
    atol = 1e-4 if engine.dtype == torch.float32 else 5e-2
    assert torch.allclose(scaled, torch.tensor(out.logprobs), atol=atol)
    assert torch.allclose(raw, torch.tensor(out.raw_logprobs), atol=atol)
    # the same seed reproduces the sample; token ids are accepted as a prompt
    assert (await _one(engine, req)).token_ids == out.token_ids
    by_ids = EngineRequest(sampling=req.sampling, prompt_token_ids=prompt, return_tokens=True)
    assert (await _one(engine, by_ids)).token_ids == out.token_ids


async def test_shared_prefix_is_computed_once_with_identical_results(engine: HFEngine) -> None:
    reqs = [_req(SHARED + f"Answer {i}.", tokens=True, temperature=1.0, seed=i) for i in range(4)]
    shared_before = engine.counters["prefix_shared_tokens"]
    together = await engine.generate(reqs)
    assert engine.counters["prefix_shared_tokens"] > shared_before
    alone = [await _one(engine, r) for r in reqs]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


async def test_sleep_frees_weights_and_wake_restores_them(tiny_dir: Path) -> None:
    eng = await _aengine(tiny_dir)
    before = await _one(eng, _req("hello judge"))
    await eng.sleep()
    assert eng.state == "asleep"
    if eng.device.type == "cuda":  # weights parked in host memory, none left on the GPU
        assert all(p.device.type == "cpu" for p in eng.model.parameters())
    else:  # dropped, reloaded from disk on wake
        assert eng.model is None
    with pytest.raises(EngineAsleepError):
        await eng.generate([_req("hello judge")])
    await eng.wake()
    assert eng.state == "awake"
    assert (await _one(eng, _req("hello judge"))).text == before.text


async def test_a_judge_that_keeps_its_weights_sleeps_without_moving_them(tiny_dir: Path) -> None:
    eng = await _aengine(tiny_dir, sleep_keeps_weights=True)
    before = await _one(eng, _req("hello judge"))
    weights = {n: p.data_ptr() for n, p in eng.model.named_parameters()}
    await eng.sleep()
    with pytest.raises(EngineAsleepError):  # asleep all the same: it serves nothing
        await eng.generate([_req("hello judge")])
    assert {n: p.data_ptr() for n, p in eng.model.named_parameters()} == weights
    await eng.wake()
    assert (await _one(eng, _req("hello judge"))).text == before.text
    await eng.shutdown()


async def test_update_weights_changes_outputs_and_survives_sleep(tiny_dir: Path) -> None:
    eng = await _aengine(tiny_dir)
    prompt = "Problem 1: what is 1 + 1?"
    before = await _one(eng, _req(prompt, tokens=True))
    assert before.weight_version == 0
    gen = torch.Generator().manual_seed(0)
    new = {
        name: p.detach() + 0.5 * torch.randn(p.shape, generator=gen).to(p.device, p.dtype)
        for name, p in eng.model.named_parameters()
    }
    await eng.update_weights(new, version=1)
    after = await _one(eng, _req(prompt, tokens=True))
    assert after.weight_version == 1
    assert after.token_ids != before.token_ids
    await eng.sleep()
    await eng.wake()
    woken = await _one(eng, _req(prompt, tokens=True))
    assert (woken.token_ids, woken.weight_version) == (after.token_ids, 1)
    with pytest.raises(EngineError, match="must be greater"):
        await eng.update_weights(new, version=1)
    with pytest.raises(EngineError, match="unknown parameter"):
        await eng.update_weights({"not.a.weight": torch.zeros(1)}, version=2)
    await eng.shutdown()


async def test_rows_that_finish_early_leave_the_batch_without_disturbing_others(
    engine: HFEngine,
) -> None:
    long_prompt = await _length_prompt(engine)
    reqs = [
        _req("short one", tokens=True, max_response_len=1),
        _req(long_prompt, tokens=True, max_response_len=8),
        _req("another short one", tokens=True, max_response_len=2),
        _req(long_prompt + " Again.", tokens=True, temperature=1.0, seed=4, max_response_len=6),
    ]
    before = engine.counters["forward_tokens"]
    together = await engine.generate(reqs)
    decode_tokens = engine.counters["forward_tokens"] - before
    alone = [await _one(engine, r) for r in reqs]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    for a, b in zip(together, alone, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert together[1].completion_tokens == 8
    width = max(len(engine.encode(r)) for r in reqs)
    assert decode_tokens < 4 * width + 4 * 7  # finished rows were not decoded to the end


# ---- the weights' dtype on a CPU: bf16 only where it is native (the probe faked) ------------

AVX2 = CpuBf16Probe(capability="AVX2", bf16_flags=frozenset())
SAPPHIRE = CpuBf16Probe(capability="AVX512", bf16_flags=frozenset({"avx512_bf16", "amx_bf16"}))


@pytest.mark.parametrize(
    ("probe", "name", "dtype"),
    [
        pytest.param(AVX2, "auto", torch.float32, id="auto-avx2"),
        pytest.param(AVX2, "bfloat16", torch.float32, id="bf16-asked-avx2"),
        pytest.param(SAPPHIRE, "auto", torch.bfloat16, id="auto-native"),
        pytest.param(SAPPHIRE, "float32", torch.float32, id="fp32-asked-native"),
        pytest.param(AVX2, "float16", torch.float16, id="fp16-asked"),
    ],
)
def test_hf_engine_weights_dtype_on_cpu(
    monkeypatch: pytest.MonkeyPatch, probe: CpuBf16Probe, name: str, dtype: torch.dtype
) -> None:
    monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: probe)
    assert _resolve_dtype(name, torch.device("cpu")) == dtype


def test_hf_engine_bf16_asked_on_a_cpu_without_it_names_the_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: AVX2)
    monkeypatch.setattr(precision, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="genrm_serve.precision"):
        assert _resolve_dtype("bfloat16", torch.device("cpu")) == torch.float32
    (record,) = caplog.records
    assert record.getMessage().startswith('engine_config.dtype="bfloat16" ignored: fp32')
