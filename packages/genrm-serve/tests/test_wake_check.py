"""The wake check: an engine proves after a wake that its weights survived the sleep.

On the hf engine (tiny random model, CPU) and on the SGLang engine over the fake SGLang, whose
resume without a CPU backup of the weights gives fresh pages (other outputs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from genrm_serve.config import EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineError
from genrm_serve.engines.hf import HFEngine
from genrm_serve.engines.sglang import SGLangEngine, launch
from genrm_serve.engines.wake_check import (
    HALF_LOGPROB_TOLERANCE,
    LOGPROB_TOLERANCE,
    PROBE_TOKENS,
    logprob_tolerance,
    probe_token_ids,
)
from genrm_serve.testing import FakeSGLangEngine, build_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _spec(model_dir: Path, engine: str, **engine_config: Any) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=1,
        engine=engine,
        engine_config=EngineConfig(**engine_config),
    )


async def _hf(model_dir: Path, **engine_config: Any) -> HFEngine:
    # fp32 on CPU: the two probes are then bit-identical (see test_engine_hf.py)
    spec = _spec(model_dir, "hf", device="cpu", dtype="float32", **engine_config)
    engine = HFEngine(spec, "judge/0")
    await engine.start()
    return engine


def test_probe_ids_fit_any_vocabulary_and_context() -> None:
    ids = probe_token_ids(512, 8192)
    assert len(ids) == PROBE_TOKENS and all(0 <= i < 512 for i in ids)
    assert ids == probe_token_ids(512, 8192)  # fixed
    assert len(probe_token_ids(3, 10)) == 5 and max(probe_token_ids(3, 10)) < 3
    assert LOGPROB_TOLERANCE == 0.02


def test_half_precision_logits_get_the_wider_bound() -> None:
    """bf16 logits of magnitude 16–32 lie 0.125 apart: a 0.02 bound failed intact weights."""
    assert logprob_tolerance("torch.float32") == LOGPROB_TOLERANCE
    assert logprob_tolerance("torch.bfloat16") == logprob_tolerance("float16")
    assert logprob_tolerance("bfloat16") == HALF_LOGPROB_TOLERANCE > 2 * 0.125


async def test_a_bf16_hf_engine_checks_its_wake_with_the_half_bound(tiny_dir: Path) -> None:
    spec = _spec(tiny_dir, "hf", device="cpu", dtype="bfloat16")
    engine = HFEngine(spec, "judge/0")
    await engine.start()
    try:
        assert engine.wake_check.tolerance == HALF_LOGPROB_TOLERANCE
        await engine.sleep()
        await engine.wake()
        assert engine.state == "awake" and engine.counters["wake_check_failures"] == 0
    finally:
        await engine.shutdown()


# -- hf ------------------------------------------------------------------------------------------
async def test_hf_wake_passes_the_check_and_counts_it(tiny_dir: Path) -> None:
    eng = await _hf(tiny_dir)
    try:
        batches = eng.counters["batches"]
        await eng.sleep()
        assert eng.counters["batches"] == batches + 1  # the probe, taken before the sleep
        await eng.wake()
        assert eng.state == "awake"
        assert eng.counters["wake_checks"] == 1 and eng.counters["wake_check_failures"] == 0
        assert eng.counters["batches"] == batches + 2
        await eng.sleep()  # the same weights: the stored probe serves again
        assert eng.counters["batches"] == batches + 2
        await eng.wake()
        assert eng.counters["wake_checks"] == 2
        assert eng.stats()["wake_checks"] == 2
    finally:
        await eng.shutdown()


async def test_hf_wake_with_corrupted_weights_fails_the_engine(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = await _hf(tiny_dir)
    real_wake = HFEngine._wake

    def corrupting_wake(self: HFEngine) -> None:
        real_wake(self)  # the model really reloads from disk; then a weight comes back wrong
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen))

    try:
        await eng.sleep()
        monkeypatch.setattr(HFEngine, "_wake", corrupting_wake)
        with pytest.raises(EngineError, match="wake check failed") as err:
            await eng.wake()
        message = str(err.value)
        assert "judge/0" in message and "before the sleep" in message
        assert f"within {LOGPROB_TOLERANCE} nats" in message
        assert eng.state == "failed"
        assert eng.counters["wake_check_failures"] == 1
        with pytest.raises(EngineError, match="failed"):
            await eng.check_health()  # what the supervisor probes: it re-creates the engine
    finally:
        await eng.shutdown()


async def test_hf_update_weights_retakes_the_probe(tiny_dir: Path) -> None:
    eng = await _hf(tiny_dir)
    try:
        await eng.sleep()
        await eng.wake()
        old = eng.wake_check.reference
        gen = torch.Generator().manual_seed(0)
        new = {
            name: p.detach() + 0.5 * torch.randn(p.shape, generator=gen)
            for name, p in eng.model.named_parameters()
        }
        await eng.update_weights(new, version=1)
        assert eng.wake_check.reference is None  # invalidated with the weights
        await eng.sleep()  # re-taken on the new weights, before the snapshot is saved
        assert eng.wake_check.reference is not None
        assert eng.wake_check.reference_version == 1
        assert eng.wake_check.reference != old
        await eng.wake()  # reloaded from the snapshot: the same weights, the check passes
        assert eng.state == "awake" and eng.counters["wake_checks"] == 2
        assert eng.counters["wake_check_failures"] == 0
    finally:
        await eng.shutdown()


async def test_hf_without_wake_check_runs_no_probe(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = await _hf(tiny_dir, wake_check=False)
    calls: list[int] = []
    real = HFEngine.generate

    async def counting(self: HFEngine, requests: Any) -> Any:
        calls.append(len(requests))
        return await real(self, requests)

    monkeypatch.setattr(HFEngine, "generate", counting)
    try:
        await eng.sleep()
        await eng.wake()
        assert calls == [] and eng.counters["wake_checks"] == 0
        assert eng.wake_check.reference is None
    finally:
        await eng.shutdown()


# -- SGLang over the fake ------------------------------------------------------------------------
@pytest.fixture
async def start(tiny_dir: Path) -> AsyncIterator[Any]:
    engines: list[SGLangEngine] = []

    async def make(**engine_config: Any) -> tuple[SGLangEngine, FakeSGLangEngine]:
        spec = _spec(tiny_dir, "sglang", max_context_len=64, **engine_config)
        engine = SGLangEngine(spec, "judge/0", engine_cls=FakeSGLangEngine)
        engines.append(engine)
        await engine.start()
        return engine, engine.sgl

    yield make
    for engine in engines:
        await engine.shutdown()


async def test_sglang_wake_passes_the_check(start: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)
    engine, fake = await start()
    await engine.sleep()
    assert fake.calls.count("async_generate") == 1  # the probe, before the release
    await engine.wake()
    assert fake.calls.count("async_generate") == 2
    assert engine.state == "awake" and engine.counters["wake_checks"] == 1
    assert engine.counters["wake_check_failures"] == 0
    ref = engine.wake_check.reference
    assert ref is not None and ref.logprob < 0


async def test_sglang_wake_that_loses_the_weights_fails_the_engine(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang without a CPU backup of the weights resumes onto fresh pages: the check sees it."""
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)
    # what a sleep without a weight backup would do (the engine always asks for the backup)
    real_kwargs = launch.sglang_engine_kwargs

    def without_backup(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**real_kwargs(*args, **kwargs), "enable_weights_cpu_backup": False}

    monkeypatch.setattr(launch, "sglang_engine_kwargs", without_backup)
    engine, fake = await start()
    await engine.sleep()
    with pytest.raises(EngineError, match="wake check failed") as err:
        await engine.wake()
    assert "judge/0" in str(err.value) and not fake.weights_valid
    assert engine.state == "failed" and engine.counters["wake_check_failures"] == 1
    with pytest.raises(EngineError, match="wake check failed"):
        await engine.check_health()


async def test_sglang_update_weights_retakes_the_probe(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)
    engine, _fake = await start()
    await engine.sleep()
    await engine.wake()
    await engine.update_weights({"w": torch.zeros(1)}, version=1)
    assert engine.wake_check.reference is None
    await engine.sleep()
    assert engine.wake_check.reference_version == 1
    await engine.wake()
    assert engine.state == "awake" and engine.counters["wake_checks"] == 2


async def test_sglang_without_wake_check_runs_no_probe(
    start: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeSGLangEngine, "step_s", 0.0)
    engine, fake = await start(wake_check=False)
    await engine.sleep()
    await engine.wake()
    assert "async_generate" not in fake.calls
    assert engine.counters["wake_checks"] == 0
