"""One training run, end to end: examples, the frozen base, LoRA, the steps, the adapter.

The order is part of the result: the seeds are set first, and the steps that draw from torch's
generator (the cut model's top, then LoRA's initial weights) come in the same order every run,
so a seed rebuilds an adapter (the shipped one's ``training.json`` gives its command).
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from genrm_judge_train.adapter import attach_lora, on_full_model, save_adapter
from genrm_judge_train.cut_model import CutModel, check_cut, load_or_build_cache
from genrm_judge_train.encoding import Item, Tokenised
from genrm_judge_train.evaluation import evaluate
from genrm_judge_train.examples import JudgeExample
from genrm_judge_train.mix import build_examples
from genrm_judge_train.record import RunFacts, training_record
from genrm_judge_train.steps import Schedule, StepInputs, run_steps
from genrm_serve.models import resolve_model_path
from genrm_serve.precision import probe_cpu_bf16

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Runtime:
    """Where the run computes: the device, whether bf16 autocast is on, the machine in words."""

    device: str
    autocast: bool
    where: str


@dataclass
class Prepared:
    """The encoded examples and the frozen base, cut (with its states cached) or whole."""

    tok: Tokenised
    train_items: list[Item]
    held_items: list[Item]
    base: Any
    layer_ids: list[int]  # the layers LoRA adapts, numbered as in the full model
    cut: CutModel | None
    cache: list[torch.Tensor]
    cache_s: float


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def set_up(ns: argparse.Namespace) -> Runtime:
    """Seeds, threads, the device and bf16 autocast (``--bf16 auto``: where the CPU has it)."""
    seed_everything(ns.seed)
    torch.set_num_threads(ns.threads or len(os.sched_getaffinity(0)))
    device = ns.device if ns.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    probe = probe_cpu_bf16()
    native = probe.native if device == "cpu" else True
    autocast = {"on": True, "off": False, "auto": native}[ns.bf16]
    where = probe.describe() if device == "cpu" else torch.cuda.get_device_name(0)
    logger.info("%s; bf16 autocast %s", where, autocast)
    return Runtime(device, autocast, where)


def load_base(model_dir: Path, whole: bool) -> Any:
    """The base model in fp32, frozen.

    Eager attention where the whole model trains on left-padded rows: its additive mask keeps a
    padded row finite, and it is what transformers recommends for training Gemma models. A
    bs-64 GPU run on sdpa went to NaN at step ~115 (cause not isolated).
    """
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, **({"attn_implementation": "eager"} if whole else {})
    )
    base.eval()
    base.requires_grad_(False)
    return base


def prepare(
    ns: argparse.Namespace, runtime: Runtime, train: list[JudgeExample], held: list[JudgeExample]
) -> Prepared:
    """Encode the examples, load the base and, on a CPU, cut it and cache the frozen layers."""
    from transformers import AutoConfig

    model_dir = resolve_model_path(ns.model)
    n_layers = int(AutoConfig.from_pretrained(model_dir).get_text_config().num_hidden_layers)
    if not 0 < ns.top_layers <= n_layers:
        raise SystemExit(f"--top-layers {ns.top_layers}: the model has {n_layers} layers")
    tok = Tokenised(model_dir, ns.max_len)
    train_items, held_items = tok.items(train), tok.items(held)
    # With every layer adapted there is nothing below them to cache: the whole model runs.
    whole = runtime.device == "cuda" or ns.no_cut or ns.top_layers == n_layers
    base = load_base(model_dir, whole)
    layer_ids = list(range(n_layers - ns.top_layers, n_layers))
    cut: CutModel | None = None
    cache: list[torch.Tensor] = []
    t_cache = time.monotonic()
    if whole:
        base.to(runtime.device)  # a GPU runs the frozen layers every step faster than a cache loads
    else:
        cut = CutModel(base, ns.top_layers)
        check_cut(cut, train_items[:2], tok)
        cache = load_or_build_cache(
            cut, train_items, tok, runtime.autocast, ns.cache_file, ns.batch_size * 2
        )
    cache_s = time.monotonic() - t_cache
    if cut is not None:
        logger.info(
            "cached the states entering layer %d for %d examples in %.0f s",
            cut.cut,
            len(cache),
            cache_s,
        )
    return Prepared(tok, train_items, held_items, base, layer_ids, cut, cache, cache_s)


def schedule(ns: argparse.Namespace) -> Schedule:
    return Schedule(
        steps=ns.steps,
        batch_size=ns.batch_size,
        lr=ns.lr,
        warmup=ns.warmup,
        seed=ns.seed,
        stop_after=ns.stop_after,
        max_train_s=ns.max_train_s,
    )


def train(ns: argparse.Namespace) -> None:
    """The run ``genrm-judge-train`` makes of its flags: the adapter and its ``training.json``
    in ``--out``."""
    t_start = time.monotonic()
    runtime = set_up(ns)
    train_examples, held_examples = build_examples(ns)
    prep = prepare(ns, runtime, train_examples, held_examples)
    model = attach_lora(prep.base, prep.cut, ns.rank, ns.alpha, prep.layer_ids, ns.init_adapter)
    params = [p for p in model.parameters() if p.requires_grad]
    logger.info(
        "LoRA r=%d alpha=%s on layers %d-%d: %d trainable parameters",
        ns.rank,
        ns.alpha,
        prep.layer_ids[0],
        prep.layer_ids[-1],
        sum(p.numel() for p in params),
    )
    cache = prep.cache if prep.cut is not None else None
    inputs = StepInputs(prep.train_items, prep.tok, cache, runtime.device, runtime.autocast)
    log = run_steps(model, params, inputs, schedule(ns))
    prep.cache.clear()
    if prep.cut is not None:  # the adapter on the full model (layers above the cut)
        model = on_full_model(prep.base, prep.cut, model, ns.rank, ns.alpha, prep.layer_ids)
    train_s = time.monotonic() - log.started
    size = ns.batch_size * 2
    held = prep.held_items
    scores = evaluate(model, held, prep.tok, runtime.autocast, size, runtime.device) if held else {}
    logger.info("held out (in-script, greedy over the vocabulary): %s", scores)
    facts = RunFacts(
        layer_ids=prep.layer_ids,
        cache_s=prep.cache_s,
        train_examples=len(train_examples),
        held_out_examples=len(held_examples),
        scores=scores,
        train_s=train_s,
        total_s=time.monotonic() - t_start,
        device=runtime.where,
        autocast=runtime.autocast,
    )
    meta = training_record(ns, log, facts)
    if not all(torch.isfinite(p).all() for p in params):
        raise SystemExit("the adapter's weights are not finite: not written")
    save_adapter(model, ns.out, meta)
    logger.info("adapter written to %s (%.1f s in all)", ns.out, meta["total_s"])
