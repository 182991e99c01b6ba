"""Fine-tune a judge: a LoRA adapter that makes a causal LM answer the dapo-genrm prompt with 1 / 0.

This is how the embedded judge (``genrm_serve/adapters/gemma3-270m-judge``) was made, and how a
user makes one for their own data. It lives in ``scripts/`` rather than in a package because it
crosses two of them (the judge prompt of genrm-rewards, the prompt rendering of genrm-serve's
engine) and no wheel needs it at run time.

What is trained: the prompt is rendered and tokenised exactly as the hf engine does it
(``PromptEncoder``, the plain chat template for a base model), and the loss is the
cross-entropy of the verdict token ("1" or "0") after the prompt plus that of the end-of-text
token after the verdict — a bare "1"/"0" that stops. Only those two positions' logits are
computed (``logits_to_keep``), never the 262k-token vocabulary at every position: that is what
makes a CPU run possible. LoRA on every attention and MLP projection; the base stays frozen.

Data: ``--dapo`` (questions and integer labels of dapo-math-17k) turned into labelled examples by
construction (``genrm_rewards.judge_examples``), or ``--examples`` (your own jsonl of
``{"question", "label", "response", "verdict"}``). A held-out split (questions never trained on)
is scored at the end; ``benchmarks/judge_agreement.py`` measures through the real engine.

    # the shipped adapter (stage 11, seeded; 338 s of training on one H100)
    python scripts/train_judge.py --device cuda --no-cut --top-layers 18 --rank 16 --alpha 32 \
        --held-out-examples 400 --batch-size 64 --warmup 50 --steps 1150 --seed 11 \
        --train-examples 30000 --format-examples 14000 --grader-examples 4000 \
        --grader-right-examples 1000 --solution-examples 8000 --answer-form-examples 12000 \
        --lr 3e-4 --out packages/genrm-serve/src/genrm_serve/adapters/gemma3-270m-judge
    # your own data, your own base model folder
    python scripts/train_judge.py --examples my_pairs.jsonl --model /path/to/model --out my-judge
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import platform
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from genrm_rewards.dapo_genrm import build_messages
from genrm_rewards.judge_answer_forms import ANSWER_FORM_FAMILIES, CONTRAST_FAMILIES
from genrm_rewards.judge_examples import (
    JudgeExample,
    load_dapo_problems,
    make_examples,
    read_examples,
    split_problems,
    write_examples,
)
from genrm_rewards.judge_format_examples import make_format_examples
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.prompts import PromptEncoder
from genrm_serve.models import resolve_model_path
from genrm_serve.precision import probe_cpu_bf16

logger = logging.getLogger("train_judge")

#: Steps with non-finite gradients dropped before the run stops (or one in 50, if more). One
#: such step, applied, turns every LoRA weight into NaN: seen on an H200 at step ~115 of a
#: bs-64 run, with the loss 0.28 ten steps before.
MAX_SKIPPED = 5

#: LoRA targets: every attention and MLP projection of a Llama/Gemma-style decoder layer.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def default_dapo() -> Path:
    """``<repo>/../shared/data/dapo-math-17k/dapo-math-17k.jsonl`` (the project's data layout)."""
    return Path(__file__).resolve().parents[2] / "shared/data/dapo-math-17k/dapo-math-17k.jsonl"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Tokenised:
    """Examples as the engine would see them: prompt ids, and the verdict + stop tokens."""

    def __init__(self, model_dir: Path, max_len: int) -> None:
        from transformers import AutoTokenizer

        self.encoder = PromptEncoder(AutoTokenizer.from_pretrained(model_dir), max_len)
        tok = self.encoder.tokenizer
        self.verdict_ids = {v: self._single(tok, str(v)) for v in (0, 1)}
        self.stop_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id)
        self.max_len = max_len

    @staticmethod
    def _single(tok: Any, text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise SystemExit(f"the tokenizer splits {text!r} into {ids}: not a one-token verdict")
        return int(ids[0])

    def prompt_ids(self, e: JudgeExample) -> list[int]:
        from genrm_client.types import Message, SamplingParams

        messages = build_messages(e.question, e.label, e.response)
        request = EngineRequest(
            sampling=SamplingParams(), messages=[Message(**m) for m in messages]
        )
        return self.encoder.encode(request)[-self.max_len :]


def batches(
    items: list[tuple[list[int], int]],
    size: int,
    rng: random.Random,
    key: Any = lambda x: len(x[0]),
) -> list[list[tuple[list[int], int]]]:
    """Batches of similar length (less padding), in a seeded random order."""
    order = list(items)
    rng.shuffle(order)
    out = []
    window = size * 16
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=key)
        out.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
    rng.shuffle(out)
    return out


def collate(
    batch: list[tuple[list[int], int]], tok: Tokenised
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``prompt + verdict`` rows, their mask and positions, and the 2 targets."""
    seqs = [[*ids, tok.verdict_ids[v]] for ids, v in batch]
    width = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        input_ids[i, width - len(s) :] = torch.tensor(s)
        mask[i, width - len(s) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    targets = torch.tensor([[tok.verdict_ids[v], tok.stop_id] for _, v in batch])
    return input_ids, mask, positions, targets


def last_logits(model: Any, input_ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor) -> Any:
    """Logits at the last two positions only (the verdict's and the stop token's)."""
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, logits_to_keep=2)
    return out.logits.float()


def evaluate(
    model: Any,
    items: list[tuple[list[int], int]],
    tok: Tokenised,
    autocast: bool,
    size: int,
    device: str = "cpu",
) -> dict[str, float]:
    """Greedy verdict over the full vocabulary: agreement, and replies that are not 1/0 + stop."""
    model.eval()
    agree = clean = 0
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            ids, mask, pos, targets = (t.to(device) for t in collate(chunk, tok))
            pred = last_logits(model, ids, mask, pos).argmax(-1).cpu()
            targets = targets.cpu()
            agree += int((pred[:, 0] == targets[:, 0]).sum())
            verdict_tokens = torch.tensor(list(tok.verdict_ids.values()))
            clean += int(
                (torch.isin(pred[:, 0], verdict_tokens) & (pred[:, 1] == tok.stop_id)).sum()
            )
    model.train()
    return {"agreement": agree / len(items), "clean_reply_rate": clean / len(items)}


class _Stop(Exception):
    """Raised by the capture hook: the layers above the cut are not needed for the cache."""


class SplitModel:
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
        self.top: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = {}
        for key, value in base.state_dict().items():
            m = re.match(r"(.*\.layers\.)(\d+)(\..*)", key)
            if m is None:
                state[key] = value
            elif int(m.group(2)) >= self.cut:
                state[f"{m.group(1)}{int(m.group(2)) - self.cut}{m.group(3)}"] = value
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

        out = {}
        for key, value in get_peft_model_state_dict(peft_top).items():
            m = re.match(r"(.*\.layers\.)(\d+)(\..*)", key)
            assert m is not None, key
            out[f"{m.group(1)}{int(m.group(2)) + self.cut}{m.group(3)}"] = value.detach().clone()
        return out


def check_split(split: SplitModel, items: list[tuple[list[int], int]], tok: Tokenised) -> None:
    """The cut model must compute what the base computes (fp32): else the adapter would be
    trained for a model the engine never runs."""
    ids, mask, pos, _ = collate(items, tok)
    with torch.no_grad():
        want = last_logits(split.base, ids, mask, pos)
        states = split.bottom_states(ids, mask, pos, autocast=False)
        got = split.top(
            inputs_embeds=states, attention_mask=mask, position_ids=pos, logits_to_keep=2
        ).logits.float()
    diff = float((want - got).abs().max())
    if diff > 1e-3 * float(want.abs().max()):
        raise SystemExit(f"the cut model differs from the base: max |logit diff| {diff}")
    logger.info("cut model check: max |logit diff| %.2e", diff)


def build_cache(
    split: SplitModel,
    items: list[tuple[list[int], int]],
    tok: Tokenised,
    autocast: bool,
    size: int,
) -> list[torch.Tensor]:
    """Per example, the (unpadded) bf16 hidden states entering the first adapted layer."""
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    cache: list[torch.Tensor | None] = [None] * len(items)
    for n, start in enumerate(range(0, len(order), size)):
        idx = order[start : start + size]
        ids, mask, pos, _ = collate([items[i] for i in idx], tok)
        states = split.bottom_states(ids, mask, pos, autocast).to(torch.bfloat16)
        for row, i in enumerate(idx):
            cache[i] = states[row, mask[row].bool()].clone()
        if n % 20 == 0:
            logger.info("cache %d/%d", start + len(idx), len(items))
    return [c for c in cache if c is not None]


def load_or_build_cache(
    split: SplitModel,
    items: list[tuple[list[int], int]],
    tok: Tokenised,
    autocast: bool,
    ns: argparse.Namespace,
) -> list[torch.Tensor]:
    """The frozen layers' states, from ``--cache-file`` when it holds these examples' states, or
    those of their first ones (a run that appends examples, e.g. ``--format-examples``, builds
    only the new ones' states)."""
    cache: list[torch.Tensor] = []
    if ns.cache_file is not None and ns.cache_file.is_file():
        cache = torch.load(ns.cache_file, weights_only=True)
        if len(cache) > len(items) or any(
            c.shape[0] != len(ids) + 1
            for c, (ids, _) in zip(cache, items[: len(cache)], strict=True)
        ):
            raise SystemExit(f"{ns.cache_file} was built for other examples: delete it")
        if len(cache) == len(items):
            return cache
        logger.info("%s holds the first %d examples' states", ns.cache_file, len(cache))
    cache += build_cache(split, items[len(cache) :], tok, autocast, ns.batch_size * 2)
    if ns.cache_file is not None:
        torch.save(cache, ns.cache_file)
    return cache


def collate_states(
    rows: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded cached states, their mask and positions (as ``collate`` lays out ids)."""
    width = max(r.shape[0] for r in rows)
    states = torch.zeros((len(rows), width, rows[0].shape[1]), dtype=torch.float32)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        states[i, width - r.shape[0] :] = r.float()
        mask[i, width - r.shape[0] :] = 1
    return states, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def init_from_adapter(model: Any, adapter: Path, cut: int) -> None:
    """Start from an adapter this script wrote (a second stage on the same examples)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = {}
    for key, value in load_file(adapter / "adapter_model.safetensors").items():
        m = re.match(r"(.*\.layers\.)(\d+)(\..*)", key)
        if m is None or int(m.group(2)) < cut:
            raise SystemExit(f"{adapter}: {key} is not above the cut at layer {cut}")
        state[f"{m.group(1)}{int(m.group(2)) - cut}{m.group(3)}"] = value.float()
    result = set_peft_model_state_dict(model, state)
    if result.unexpected_keys:
        raise SystemExit(f"{adapter}: unexpected {result.unexpected_keys[:4]}")
    logger.info("starting from the adapter %s", adapter)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded", help="base model folder, or 'embedded'")
    ap.add_argument("--dapo", type=Path, default=None, help="DAPO-style jsonl (default: shared)")
    ap.add_argument("--examples", type=Path, default=None, help="your own labelled jsonl")
    ap.add_argument("--out", type=Path, required=True, help="adapter folder to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-examples", type=int, default=1600)
    ap.add_argument("--held-out-examples", type=int, default=160)
    ap.add_argument(
        "--format-examples",
        type=int,
        default=0,
        help="typesetting pairs appended to the training examples (judge_format_examples)",
    )
    ap.add_argument(
        "--grader-examples",
        type=int,
        default=0,
        help="wrong answers that address the grader ('Judgement: 1', ...), appended",
    )
    ap.add_argument(
        "--grader-right-examples",
        type=int,
        default=0,
        help="right answers followed by the same notes to the grader, appended",
    )
    ap.add_argument(
        "--solution-examples",
        type=int,
        default=0,
        help="answers inside the closing sentence of a long LaTeX solution, appended",
    )
    ap.add_argument(
        "--answer-form-examples",
        type=int,
        default=0,
        help="one value stated in another form (x = 5 for 5, a chain, an interval), appended",
    )
    ap.add_argument(
        "--contrast-examples",
        type=int,
        default=0,
        help="0.5 for 1/2 against 0.33 for 1/3, an equation label against its right side, "
        "grouped thousands against a list (judge_answer_forms.CONTRAST_FAMILIES), appended",
    )
    ap.add_argument("--held-out-fraction", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument(
        "--top-layers",
        type=int,
        default=9,
        help="LoRA on the top N decoder layers; the layers below run once per example",
    )
    ap.add_argument("--max-len", type=int, default=768, help="prompt tokens kept (the tail)")
    ap.add_argument("--bf16", choices=("auto", "on", "off"), default="auto")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: the cores)")
    ap.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when a GPU is present",
    )
    ap.add_argument(
        "--no-cut",
        action="store_true",
        help="run the whole model every step, no cache of the frozen layers (always on a GPU)",
    )
    ap.add_argument("--max-train-s", type=float, default=0, help="stop the steps after this")
    ap.add_argument(
        "--stop-after",
        type=int,
        default=0,
        help="stop after this many steps of the --steps schedule (replays a timed-out run)",
    )
    ap.add_argument(
        "--cache-file",
        type=Path,
        default=None,
        help="keep the frozen layers' states here (reused by a run on the same examples)",
    )
    ap.add_argument(
        "--init-adapter", type=Path, default=None, help="continue from an adapter of this script"
    )
    ap.add_argument("--dump-examples", type=Path, default=None, help="write the examples here")
    ns = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    t_start = time.monotonic()
    seed_everything(ns.seed)
    torch.set_num_threads(ns.threads or len(os.sched_getaffinity(0)))
    device = ns.device if ns.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    probe = probe_cpu_bf16()
    native = probe.native if device == "cpu" else True
    autocast = {"on": True, "off": False, "auto": native}[ns.bf16]
    where = probe.describe() if device == "cpu" else torch.cuda.get_device_name(0)
    logger.info("%s; bf16 autocast %s", where, autocast)

    if ns.examples is not None:
        for flag, n in (
            ("--format-examples", ns.format_examples),
            ("--grader-examples", ns.grader_examples),
            ("--grader-right-examples", ns.grader_right_examples),
            ("--solution-examples", ns.solution_examples),
            ("--answer-form-examples", ns.answer_form_examples),
            ("--contrast-examples", ns.contrast_examples),
        ):
            if n:
                raise SystemExit(
                    f"{flag} {n}: these pairs are built from the dapo questions (--dapo); "
                    "with --examples, put them in your jsonl"
                )
        examples = read_examples(ns.examples)
        rng = random.Random(ns.seed)
        rng.shuffle(examples)
        n_held = max(1, int(len(examples) * ns.held_out_fraction))
        held, train = examples[:n_held], examples[n_held:]
    else:
        problems = load_dapo_problems(ns.dapo or default_dapo())
        train_p, held_p = split_problems(problems, ns.held_out_fraction)
        train = make_examples(train_p, ns.train_examples, seed=ns.seed)
        train += make_format_examples(train_p, ns.format_examples, seed=ns.seed + 2)
        train += make_examples(train_p, ns.grader_examples, seed=ns.seed + 3, grader_probes=True)
        train += make_examples(
            train_p, ns.grader_right_examples, seed=ns.seed + 4, grader_right=True
        )
        train += make_examples(train_p, ns.solution_examples, seed=ns.seed + 5, solution_tails=True)
        train += make_format_examples(
            train_p, ns.answer_form_examples, seed=ns.seed + 6, families=ANSWER_FORM_FAMILIES
        )
        train += make_format_examples(
            train_p, ns.contrast_examples, seed=ns.seed + 7, families=CONTRAST_FAMILIES
        )
        held = make_examples(held_p, ns.held_out_examples, seed=ns.seed + 1)
    if ns.dump_examples:
        ns.dump_examples.mkdir(parents=True, exist_ok=True)
        write_examples(ns.dump_examples / "train.jsonl", train)
        write_examples(ns.dump_examples / "held_out.jsonl", held)
    logger.info(
        "examples: %d train (%s), %d held out",
        len(train),
        dict(Counter(e.verdict for e in train)),
        len(held),
    )

    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = resolve_model_path(ns.model)
    n_layers = int(AutoConfig.from_pretrained(model_dir).get_text_config().num_hidden_layers)
    if not 0 < ns.top_layers <= n_layers:
        raise SystemExit(f"--top-layers {ns.top_layers}: the model has {n_layers} layers")
    tok = Tokenised(model_dir, ns.max_len)
    train_items = [(tok.prompt_ids(e), e.verdict) for e in train]
    held_items = [(tok.prompt_ids(e), e.verdict) for e in held]
    # Eager attention where the whole model trains on left-padded rows: its additive mask keeps
    # a padded row finite, and it is what transformers recommends for training Gemma models.
    # A bs-64 GPU run on sdpa went to NaN at step ~115 (cause not isolated).
    # With every layer adapted there is nothing below them to cache: the whole model runs.
    whole = device == "cuda" or ns.no_cut or ns.top_layers == n_layers
    base: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, **({"attn_implementation": "eager"} if whole else {})
    ).eval()
    base.requires_grad_(False)
    layer_ids = list(range(n_layers - ns.top_layers, n_layers))
    split: SplitModel | None = None
    cache: list[torch.Tensor] = []
    t_cache = time.monotonic()
    if whole:
        base.to(device)  # a GPU runs the frozen layers every step faster than a cache loads
    else:
        split = SplitModel(base, ns.top_layers)
        check_split(split, train_items[:2], tok)
        cache = load_or_build_cache(split, train_items, tok, autocast, ns)
    cache_s = time.monotonic() - t_cache
    if split is not None:
        logger.info(
            "cached the states entering layer %d for %d examples in %.0f s",
            split.cut,
            len(cache),
            cache_s,
        )

    lora = {
        "r": ns.rank,
        "lora_alpha": ns.alpha,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "task_type": "CAUSAL_LM",
    }
    if split is not None:
        model: Any = get_peft_model(split.top, LoraConfig(**lora))
        if ns.init_adapter is not None:
            init_from_adapter(model, ns.init_adapter, split.cut)
    else:
        model = get_peft_model(base, LoraConfig(**lora, layers_to_transform=layer_ids))
        if ns.init_adapter is not None:
            init_from_adapter(model, ns.init_adapter, 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in trainable)
    logger.info(
        "LoRA r=%d alpha=%s on layers %d-%d: %d trainable parameters",
        ns.rank,
        ns.alpha,
        layer_ids[0],
        layer_ids[-1],
        n_params,
    )
    opt = torch.optim.AdamW(trainable, lr=ns.lr, weight_decay=0.0)

    def lr_at(step: int) -> float:
        if step < ns.warmup:
            return (step + 1) / ns.warmup
        progress = (step - ns.warmup) / max(1, ns.steps - ns.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    rng = random.Random(ns.seed)
    indexed = [(list(range(i, i + 1)), v) for i, (_, v) in enumerate(train_items)]
    length = (
        (lambda x: len(cache[x[0][0]]))
        if split is not None
        else (lambda x: len(train_items[x[0][0]][0]))
    )
    plan: list[list[tuple[list[int], int]]] = []
    while len(plan) < ns.steps:
        plan.extend(batches(indexed, ns.batch_size, rng, key=length))
    model.train()
    losses: list[float] = []
    skipped: list[int] = []  # steps whose update was dropped (non-finite gradients)
    t_train = time.monotonic()
    step = 0
    for step, batch in enumerate(plan[: ns.steps], start=1):
        targets = torch.tensor([[tok.verdict_ids[v], tok.stop_id] for _, v in batch])
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            if split is not None:
                states, mask, pos = collate_states([cache[x[0][0]] for x in batch])
                out = model(
                    inputs_embeds=states, attention_mask=mask, position_ids=pos, logits_to_keep=2
                )
            else:
                ids, mask, pos, targets = (
                    t.to(device) for t in collate([train_items[x[0][0]] for x in batch], tok)
                )
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=2)
        logits = out.logits.float()
        loss_verdict = torch.nn.functional.cross_entropy(logits[:, 0], targets[:, 0])
        loss_stop = torch.nn.functional.cross_entropy(logits[:, 1], targets[:, 1])
        loss = loss_verdict + 0.5 * loss_stop
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        if torch.isfinite(norm):  # a non-finite loss gives a non-finite norm too
            opt.step()
            losses.append(float(loss_verdict.detach()))
        else:
            skipped.append(step)
            widths = [len(train_items[x[0][0]][0]) for x in batch]
            logger.warning(
                "step %d: non-finite gradient norm (loss %s; prompts of %d-%d tokens): skipped",
                step,
                float(loss.detach()),
                min(widths),
                max(widths),
            )
            if len(skipped) > max(MAX_SKIPPED, step // 50):
                raise SystemExit(
                    f"{len(skipped)} of {step} steps had non-finite gradients (steps "
                    f"{skipped[:8]}...): stopped before they ruin the adapter; the warnings above "
                    "give each one's prompt lengths"
                )
        sched.step()
        opt.zero_grad(set_to_none=True)
        if losses and (step % 10 == 0 or step == 1):
            elapsed = time.monotonic() - t_train
            logger.info(
                "step %d/%d loss(verdict) %.4f (last 10: %.4f) %.1f s/step",
                step,
                ns.steps,
                losses[-1],
                sum(losses[-10:]) / len(losses[-10:]),
                elapsed / step,
            )
        if ns.stop_after and step >= ns.stop_after:
            logger.info("stopping after %d steps: --stop-after", step)
            break
        if ns.max_train_s and time.monotonic() - t_train > ns.max_train_s:
            logger.info("stopping after %d steps: --max-train-s reached", step)
            break
    cache.clear()
    if split is not None:  # the adapter on the full model (layers above the cut)
        full: Any = get_peft_model(base, LoraConfig(**lora, layers_to_transform=layer_ids))
        result = set_peft_model_state_dict(full, split.lora_state_for_base(model))
        if result.unexpected_keys:
            raise SystemExit(f"adapter transfer: unexpected {result.unexpected_keys[:4]}")
        model = full
    train_s = time.monotonic() - t_train
    scores = (
        evaluate(model, held_items, tok, autocast, ns.batch_size * 2, device) if held_items else {}
    )
    logger.info("held out (in-script, greedy over the vocabulary): %s", scores)
    meta = {
        "base_model": ns.model,
        "data": "user examples"
        if ns.examples
        else (
            f"dapo-math-17k by construction ({ns.train_examples}), plus {ns.format_examples} "
            f"typesetting pairs, {ns.grader_examples} grader-addressed wrong answers and "
            f"{ns.grader_right_examples} right answers with notes to the grader, "
            f"{ns.solution_examples} solution tails, {ns.answer_form_examples} answer forms, "
            f"{ns.contrast_examples} contrast pairs"
        ),
        "seed": ns.seed,
        "init_adapter": str(ns.init_adapter) if ns.init_adapter else None,
        "steps": step,
        "batch_size": ns.batch_size,
        "lr": ns.lr,
        "rank": ns.rank,
        "alpha": ns.alpha,
        "target_modules": list(TARGET_MODULES),
        "layers_adapted": layer_ids,
        "cache_s": round(cache_s, 1),
        "train_examples": len(train),
        "held_out_examples": len(held),
        "held_out_in_script": scores,
        "final_loss_last50": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "skipped_steps": skipped,
        "train_s": round(train_s, 1),
        "total_s": round(time.monotonic() - t_start, 1),
        "device": where,
        "bf16_autocast": autocast,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
    }
    if not all(torch.isfinite(p).all() for p in trainable):
        raise SystemExit("the adapter's weights are not finite: not written")
    save_adapter(model, ns.out, meta)
    logger.info("adapter written to %s (%.1f s in all)", ns.out, meta["total_s"])


if __name__ == "__main__":
    main()
