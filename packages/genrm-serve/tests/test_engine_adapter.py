"""LoRA adapters in the hf engine (``engine_config.adapter_path``) and the shipped judge adapter.

A tiny random model and a tiny random adapter: the engine with the adapter must produce what
the same model with the adapter's update added to its weights (computed here, independently of
peft) produces, and something else than the base. Never a real model's verdicts.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineError, EngineOutput, EngineRequest
from genrm_serve.engines.hf import HFEngine
from genrm_serve.models import (
    EMBEDDED_JUDGE_ADAPTERS,
    resolve_adapter,
    shipped_adapter_dir,
)
from genrm_serve.testing import build_tiny_model

peft = pytest.importorskip("peft", reason="the hf extra's peft is not installed")

TARGETS = ["q_proj", "v_proj", "down_proj"]
RANK, ALPHA = 4, 8.0
PROMPTS = [f"Is {i} + {i} equal to {2 * i}? Reply 1 or 0." for i in range(6)]
#: the embedded Gemma 3 270M's projection shapes (out, in): what the shipped adapter must fit
GEMMA_270M_SHAPES = {
    "q_proj": (1024, 640),
    "k_proj": (256, 640),
    "v_proj": (256, 640),
    "o_proj": (640, 1024),
    "gate_proj": (2048, 640),
    "up_proj": (2048, 640),
    "down_proj": (640, 2048),
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"))


def _random_adapter(model_dir: Path, out: Path, seed: int = 3) -> Path:
    """A LoRA adapter with random A *and* B (peft's default B is 0: no change to test)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.3)
    peft_model.save_pretrained(out)
    return out


def _merged_by_hand(model_dir: Path, adapter: Path, out: Path) -> Path:
    """``W + (alpha / r) * B @ A`` for every adapted weight, written as a model folder."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out)
    weights = load_file(model_dir / "model.safetensors")
    lora = load_file(adapter / "adapter_model.safetensors")
    scale = ALPHA / RANK
    changed = 0
    for key in list(weights):
        module = key.removesuffix(".weight")
        a = lora.get(f"base_model.model.{module}.lora_A.weight")
        b = lora.get(f"base_model.model.{module}.lora_B.weight")
        if a is None or b is None:
            continue
        weights[key] = weights[key] + scale * (b.float() @ a.float())
        changed += 1
    assert changed == 2 * len(TARGETS), changed  # 2 layers of the tiny model
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _engine(model_dir: Path, **engine_config: object) -> HFEngine:
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(  # type: ignore[arg-type]
            **{"device": "cpu", "dtype": "float32", **engine_config}
        ),
    )
    engine = HFEngine(spec, "judge/0")
    asyncio.run(engine.start())
    return engine


def _generate(engine: HFEngine) -> list[EngineOutput]:
    sampling = SamplingParams(temperature=0.0, max_response_len=6).merged_over(DEFAULT_SAMPLING)
    requests = [
        EngineRequest(
            sampling=sampling, messages=[Message(role="user", content=p)], return_tokens=True
        )
        for p in PROMPTS
    ]
    return asyncio.run(engine.generate(requests))


def test_adapter_equals_its_update_added_to_the_weights(tiny_dir: Path, tmp_path: Path) -> None:
    adapter = _random_adapter(tiny_dir, tmp_path / "adapter")
    merged = _merged_by_hand(tiny_dir, adapter, tmp_path / "merged")

    with_adapter = _generate(_engine(tiny_dir, adapter_path=str(adapter)))
    by_hand = _generate(_engine(merged))
    base = _generate(_engine(tiny_dir))

    assert [o.token_ids for o in with_adapter] == [o.token_ids for o in by_hand]
    for a, b in zip(with_adapter, by_hand, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # and the adapter changes what the model says
    assert [o.token_ids for o in with_adapter] != [o.token_ids for o in base] or any(
        a.logprobs != pytest.approx(b.logprobs, abs=1e-3)
        for a, b in zip(with_adapter, base, strict=True)
    )


def test_adapter_path_none_and_other_models(tiny_dir: Path) -> None:
    assert resolve_adapter(str(tiny_dir), None) is None  # a model folder: no default adapter
    assert resolve_adapter("embedded", "none") is None  # the bare base, asked for
    engine = _engine(tiny_dir, adapter_path="none")
    assert engine.adapter_dir is None


@pytest.mark.parametrize(
    "make, match",
    [
        pytest.param(lambda p: p / "nowhere", "is not a folder", id="missing"),
        pytest.param(lambda p: p, "is not a LoRA adapter folder", id="not-an-adapter"),
    ],
)
def test_a_wrong_adapter_path_names_the_key(tiny_dir: Path, tmp_path: Path, make, match) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    with pytest.raises(EngineError, match=rf"engine_config\.adapter_path.*{match}"):
        _engine(tiny_dir, adapter_path=str(path))


def test_an_adapter_for_another_model_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    other = build_tiny_model(tmp_path / "wider", hidden=96)
    adapter = _random_adapter(other, tmp_path / "adapter")
    with pytest.raises(EngineError, match=r"engine_config\.adapter_path=.*cannot be applied"):
        _engine(tiny_dir, adapter_path=str(adapter))


def test_an_adapter_whose_tensors_do_not_all_land_is_refused(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """Tensors named for modules the model lacks would merge as a silent no-op."""
    from safetensors.torch import load_file, save_file

    adapter = _random_adapter(tiny_dir, tmp_path / "adapter")
    tensors = load_file(adapter / "adapter_model.safetensors")
    extra = {
        k.replace("layers.1.", "layers.7."): v.clone()
        for k, v in tensors.items()
        if "layers.1." in k
    }
    save_file({**tensors, **extra}, adapter / "adapter_model.safetensors")
    with pytest.raises(EngineError, match=r"adapter_path=.*does not fit.*layers\.7\."):
        _engine(tiny_dir, adapter_path=str(adapter))


def test_embedded_as_judge_resolves_to_the_shipped_adapter() -> None:
    """``embedded`` as a judge's model_path means base + the adapter shipped in the package."""
    for model_path in ("embedded", "embedded:gemma3-270m"):
        assert resolve_adapter(model_path, None) == shipped_adapter_dir("gemma3-270m")
    assert set(EMBEDDED_JUDGE_ADAPTERS) == {"gemma3-270m"}


def test_the_shipped_adapter_is_small_and_fits_the_embedded_model() -> None:
    from safetensors import safe_open

    folder = shipped_adapter_dir()
    weights = folder / "adapter_model.safetensors"
    assert weights.stat().st_size <= 10 * 1024 * 1024  # the project's cap on shipped weights
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    rank = int(config["r"])
    with safe_open(str(weights), framework="pt") as f:
        names = list(f.keys())
        assert names
        for name in names:
            module = name.split(".")[-3]
            out_dim, in_dim = GEMMA_270M_SHAPES[module]
            shape = tuple(f.get_slice(name).get_shape())
            want = (rank, in_dim) if ".lora_A." in name else (out_dim, rank)
            assert shape == want, (name, shape, want)
            layer = int(name.split(".layers.")[1].split(".")[0])
            assert 0 <= layer < 18


def test_an_adapter_of_a_base_that_is_no_folder_loads_without_a_hub_lookup_or_warning(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped adapter names its base "embedded" (no folder, no Hub repo): peft's check of
    the base's config.json looked it up on the Hub and warned on every start."""
    import json
    import warnings

    adapter = _random_adapter(tiny_dir, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "embedded"
    (adapter / "adapter_config.json").write_text(json.dumps(config))

    def no_hub(*args: object, **kwargs: object) -> None:
        raise AssertionError("peft looked the adapter's base up on the Hub")

    monkeypatch.setattr("peft.utils.save_and_load.check_file_exists_on_hf_hub", no_hub)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _engine(tiny_dir, adapter_path=str(adapter))
    assert not [w for w in caught if "config file" in str(w.message)], caught
