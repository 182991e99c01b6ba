"""The embedded model cache, model-path resolution, the tiny test model, and the real Gemma."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from genrm_client.types import Message, SamplingParams
from genrm_serve import models
from genrm_serve.config import DEFAULT_SAMPLING, InstanceSpec
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.hf import HFEngine
from genrm_serve.models import (
    TOKENIZER_PROBE,
    check_tokenizer,
    ensure_embedded_model,
    resolve_model_path,
)
from genrm_serve.testing import build_tiny_model, require_embedded_model


def test_concurrent_callers_convert_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conversions: list[int] = []

    def convert(work: Path, out: Path) -> None:  # stands in for the 1-2 minute GGUF conversion
        conversions.append(threading.get_ident())
        time.sleep(0.3)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / models._MARKER).write_text(json.dumps({"tokenizer_probe": TOKENIZER_PROBE[1]}))

    monkeypatch.setattr(models, "_convert_gemma", convert)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_embedded_model(tmp_path)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(conversions) == 1
    assert results == [tmp_path / "gemma3-270m"] * 3
    assert not list(tmp_path.glob(".gemma3-270m.work-*"))  # the scratch folder is gone


def test_failed_conversion_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def convert(work: Path, out: Path) -> None:
        out.mkdir(parents=True)
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "_convert_gemma", convert)
    with pytest.raises(RuntimeError, match="disk full"):
        ensure_embedded_model(tmp_path)
    assert not (tmp_path / "gemma3-270m").exists()


def test_a_folder_converted_without_the_tokenizer_check_is_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache made before the check (or by a transformers that broke the tokenizer) carries no
    probe in its marker: it is converted again instead of being served as it is."""
    stale = tmp_path / "gemma3-270m"
    stale.mkdir()
    (stale / models._MARKER).write_text(json.dumps({"name": "gemma3-270m"}))
    (stale / "tokenizer.json").write_text("character-level")

    def convert(work: Path, out: Path) -> None:
        out.mkdir(parents=True)
        (out / "tokenizer.json").write_text("sentencepiece")
        (out / models._MARKER).write_text(json.dumps({"tokenizer_probe": TOKENIZER_PROBE[1]}))

    monkeypatch.setattr(models, "_convert_gemma", convert)
    assert ensure_embedded_model(tmp_path) == stale
    assert (stale / "tokenizer.json").read_text() == "sentencepiece"


def test_a_character_level_tokenizer_is_refused_with_the_transformers_version() -> None:
    """What transformers 5.17 makes of the GGUF vocabulary: one id per character, no BOS."""
    expected = TOKENIZER_PROBE[1]

    def char_level(s: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[236700 + ord(c) % 200 for c in s])

    with pytest.raises(RuntimeError, match=r"transformers \S+ converted the GGUF tokenizer"):
        check_tokenizer(char_level)
    check_tokenizer(lambda s: SimpleNamespace(input_ids=list(expected)))


def test_cache_dir_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENRM_CACHE_DIR", str(tmp_path))
    assert models.default_cache_dir() == tmp_path
    monkeypatch.delenv("GENRM_CACHE_DIR")
    assert models.default_cache_dir() == Path.home() / ".cache" / "genrm"


def test_model_path_resolution_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        resolve_model_path(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"known: \[.gemma3-270m.\]"):
        resolve_model_path("embedded:llama-9000")
    tiny = build_tiny_model(tmp_path / "tiny")
    assert resolve_model_path(str(tiny)) == tiny


def test_tiny_model_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = (build_tiny_model(tmp_path / "a", seed=1) / "model.safetensors").read_bytes()
    b = (build_tiny_model(tmp_path / "b", seed=1) / "model.safetensors").read_bytes()
    c = (build_tiny_model(tmp_path / "c", seed=2) / "model.safetensors").read_bytes()
    assert a == b and a != c


@pytest.mark.slow
async def test_embedded_gemma_answers_a_judge_prompt() -> None:
    """End to end on the real model: converts once (1-2 min) into the cache, then loads it."""
    require_embedded_model()
    spec = InstanceSpec(route_key="judge", model_path="embedded", num_gpus=1, engine="hf")
    engine = HFEngine(spec, "judge/0")
    await engine.start()
    assert engine.model.config.model_type.startswith("gemma3")
    from transformers import AutoTokenizer

    check_tokenizer(AutoTokenizer.from_pretrained(resolve_model_path("embedded")))
    prompt = (
        "Compare the model's answer with the reference answer. Reply 1 if they are consistent, "
        "0 if not.\nReference answer: 42\nModel answer: the result is 42."
    )
    request = EngineRequest(
        sampling=SamplingParams(temperature=0.0, max_response_len=4).merged_over(DEFAULT_SAMPLING),
        messages=[Message(role="user", content=prompt)],
        return_tokens=True,
    )
    out = (await engine.generate([request]))[0]
    assert engine.render(request).startswith("<bos>User: Compare")  # the plain fallback template
    assert out.prompt_tokens > 20 and 1 <= out.completion_tokens <= 4
    assert out.finish_reason in {"stop", "length"}
    assert len(out.logprobs or []) == out.completion_tokens
    await engine.shutdown()
