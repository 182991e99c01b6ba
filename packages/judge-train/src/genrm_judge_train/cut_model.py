"""The base cut at a layer, so that a CPU run trains only the layers above it.

On a CPU the frozen bottom layers cost most of a step, and they compute the same states for an
example every epoch: so they run once per example, their output is cached (in memory and in
``--cache-file``), and the steps run forward and backward through a separate model of the top
layers only, fed the cached states as ``inputs_embeds``. A GPU runs the whole model every step
faster than the cache loads, so there the cut is not used (``--no-cut`` forces that on a CPU).
"""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import Any

import torch

from genrm_judge_train.encoding import Item, Tokenised, collate
from genrm_judge_train.evaluation import last_logits

logger = logging.getLogger(__name__)

#: A decoder layer's parameter name: the prefix, the layer number, the rest.
_LAYER_KEY = re.compile(r"(.*\.layers\.)(\d+)(\..*)")


def layer_number(key: str) -> int | None:
    """The decoder layer a parameter name belongs to, or None (embeddings, final norm, head)."""
    m = _LAYER_KEY.match(key)
    return None if m is None else int(m.group(2))


def renumbered(key: str, offset: int) -> str:
    """A decoder layer's parameter name with its layer number moved by ``offset``."""
    m = _LAYER_KEY.match(key)
    assert m is not None, key
    return f"{m.group(1)}{int(m.group(2)) + offset}{m.group(3)}"


class _Stop(Exception):
    """Raised by the capture hook: the layers above the cut are not needed for the cache."""


class CutModel:
    """The base cut at layer ``cut``: frozen layers below (run once per example, their output
    cached), a separate model of the layers above that LoRA trains (``inputs_embeds`` = the
    cached hidden states). A step then runs forward and backward through the top only; the
    cache is built once and reused every epoch."""

    def __init__(self, base: Any, n_top: int) -> None:
        from transformers import AutoModelForCausalLM

        text = base.config.get_text_config()
        total = int(text.num_hidden_layers)
        if not 0 < n_top < total:  # a cut needs at least one frozen layer below it
            raise SystemExit(f"--top-layers {n_top}: a cut model needs 1 to {total - 1}")
        self.base, self.cut, self.total = base, total - n_top, total
        config = copy.deepcopy(base.config)
        config.num_hidden_layers = n_top
        config.layer_types = list(text.layer_types)[self.cut :]
        self.top: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
        state = {}
        for key, value in base.state_dict().items():
            layer = layer_number(key)
            if layer is None:
                state[key] = value
            elif layer >= self.cut:
                state[renumbered(key, -self.cut)] = value
        missing, unexpected = self.top.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if k != "lm_head.weight"]:
            raise SystemExit(f"top model: missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.top.tie_weights()

    @property
    def top_layer_ids(self) -> list[int]:
        return list(range(self.cut, self.total))

    def bottom_states(
        self, input_ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, autocast: bool
    ) -> torch.Tensor:
        """Hidden states entering layer ``cut`` (the frozen base's, no gradient)."""
        captured: list[torch.Tensor] = []

        def hook(_module: Any, _args: Any, output: Any) -> None:
            captured.append(output[0] if isinstance(output, tuple) else output)
            raise _Stop

        layer = self.base.model.layers[self.cut - 1]
        handle = layer.register_forward_hook(hook)
        try:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                self.base(input_ids=input_ids, attention_mask=mask, position_ids=pos)
        except _Stop:
            pass
        finally:
            handle.remove()
        return captured[0].float()

    def lora_state_for_base(self, peft_top: Any) -> dict[str, torch.Tensor]:
        """The trained top adapter's tensors, named for the full model's layer numbers."""
        from peft import get_peft_model_state_dict

        return {
            renumbered(key, self.cut): value.detach().clone()
            for key, value in get_peft_model_state_dict(peft_top).items()
        }


def check_cut(cut: CutModel, items: list[Item], tok: Tokenised) -> None:
    """The cut model must compute what the base computes (fp32): else the adapter would be
    trained for a model the engine never runs."""
    ids, mask, pos, _ = collate(items, tok)
    with torch.no_grad():
        want = last_logits(cut.base, ids, mask, pos)
        states = cut.bottom_states(ids, mask, pos, autocast=False)
        got = cut.top(
            inputs_embeds=states, attention_mask=mask, position_ids=pos, logits_to_keep=2
        ).logits.float()
    diff = float((want - got).abs().max())
    if diff > 1e-3 * float(want.abs().max()):
        raise SystemExit(f"the cut model differs from the base: max |logit diff| {diff}")
    logger.info("cut model check: max |logit diff| %.2e", diff)


def build_cache(
    cut: CutModel, items: list[Item], tok: Tokenised, autocast: bool, size: int
) -> list[torch.Tensor]:
    """Per example, the (unpadded) bf16 hidden states entering the first adapted layer."""
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    cache: list[torch.Tensor | None] = [None] * len(items)
    for n, start in enumerate(range(0, len(order), size)):
        idx = order[start : start + size]
        ids, mask, pos, _ = collate([items[i] for i in idx], tok)
        states = cut.bottom_states(ids, mask, pos, autocast).to(torch.bfloat16)
        for row, i in enumerate(idx):
            cache[i] = states[row, mask[row].bool()].clone()
        if n % 20 == 0:
            logger.info("cache %d/%d", start + len(idx), len(items))
    return [c for c in cache if c is not None]


def load_or_build_cache(
    cut: CutModel,
    items: list[Item],
    tok: Tokenised,
    autocast: bool,
    cache_file: Path | None,
    size: int,
) -> list[torch.Tensor]:
    """The frozen layers' states, from ``cache_file`` when it holds these examples' states, or
    those of their first ones (a run that appends examples, e.g. ``--format-examples``, builds
    only the new ones' states)."""
    cache: list[torch.Tensor] = []
    if cache_file is not None and cache_file.is_file():
        cache = torch.load(cache_file, weights_only=True)
        if len(cache) > len(items) or any(
            c.shape[0] != len(ids) + 1
            for c, (ids, _) in zip(cache, items[: len(cache)], strict=True)
        ):
            raise SystemExit(f"{cache_file} was built for other examples: delete it")
        if len(cache) == len(items):
            return cache
        logger.info("%s holds the first %d examples' states", cache_file, len(cache))
    cache += build_cache(cut, items[len(cache) :], tok, autocast, size)
    if cache_file is not None:
        torch.save(cache, cache_file)
    return cache
