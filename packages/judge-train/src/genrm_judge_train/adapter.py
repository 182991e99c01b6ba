"""The LoRA adapter: put on the model, started from an earlier one, written in peft's layout.

What is written must load into the engine as any peft adapter does (``engine_config.
adapter_path``), whichever model the steps ran on: with the base cut (:mod:`.cut_model`) the
steps train a separate model of the top layers, so its tensors are renamed back to the full
model's layer numbers before the adapter is saved, and an adapter to start from is renamed the
other way.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from genrm_judge_train.cut_model import CutModel, layer_number, renumbered

logger = logging.getLogger(__name__)

#: LoRA targets: every attention and MLP projection of a Llama/Gemma-style decoder layer.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def lora_config(rank: int, alpha: float, layers: list[int] | None = None) -> Any:
    """LoRA on every target projection; of the layers ``layers`` (None: every layer)."""
    from peft import LoraConfig

    settings: dict[str, Any] = {
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "task_type": "CAUSAL_LM",
    }
    if layers is not None:
        settings["layers_to_transform"] = layers
    return LoraConfig(**settings)


def attach_lora(
    base: Any,
    cut: CutModel | None,
    rank: int,
    alpha: float,
    layer_ids: list[int],
    init_adapter: Path | None,
) -> Any:
    """The model the steps train: LoRA on the cut model's top (all of its layers), or on the
    base's ``layer_ids``; from ``init_adapter`` when given."""
    from peft import get_peft_model

    if cut is not None:
        model = get_peft_model(cut.top, lora_config(rank, alpha))
    else:
        model = get_peft_model(base, lora_config(rank, alpha, layer_ids))
    if init_adapter is not None:
        init_from_adapter(model, init_adapter, cut.cut if cut is not None else 0)
    return model


def init_from_adapter(model: Any, adapter: Path, cut: int) -> None:
    """Start from an adapter this command wrote (a second stage on the same examples)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = {}
    for key, value in load_file(adapter / "adapter_model.safetensors").items():
        layer = layer_number(key)
        if layer is None or layer < cut:
            raise SystemExit(f"{adapter}: {key} is not above the cut at layer {cut}")
        state[renumbered(key, -cut)] = value.float()
    result: Any = set_peft_model_state_dict(model, state)
    if result.unexpected_keys:
        raise SystemExit(f"{adapter}: unexpected {result.unexpected_keys[:4]}")
    logger.info("starting from the adapter %s", adapter)


def on_full_model(
    base: Any, cut: CutModel, top: Any, rank: int, alpha: float, layer_ids: list[int]
) -> Any:
    """The adapter trained on the cut model's top, put on the full model (layers above the
    cut), so that it saves as an adapter of the base."""
    from peft import get_peft_model, set_peft_model_state_dict

    full = get_peft_model(base, lora_config(rank, alpha, layer_ids))
    result: Any = set_peft_model_state_dict(full, cut.lora_state_for_base(top))
    if result.unexpected_keys:
        raise SystemExit(f"adapter transfer: unexpected {result.unexpected_keys[:4]}")
    return full


def save_adapter(model: Any, out: Path, meta: dict[str, Any]) -> None:
    """The adapter in peft's layout, its tensors as bf16 (half the bytes; merged into the
    weights at load, where that rounding is far below the weights' own)."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    config_path = out / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config["base_model_name_or_path"] = meta["base_model"]  # not this machine's cache path
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = out / "adapter_model.safetensors"
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    (out / "training.json").write_text(json.dumps(meta, indent=1) + "\n")
