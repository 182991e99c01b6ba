"""Judgments per second of the embedded transformers engine on CPU (or a GPU), and peak RSS.

A judge request is a long prompt (~700 tokens) and a 1-2 token verdict, so this measures
prefill throughput at batch sizes 1 / 8 / 32, calling ``HFEngine.generate`` in-process (no Ray,
no HTTP: see the service benchmark for those costs). Two prompt sets:

* ``shared``: one judge instruction (~600 tokens) + a distinct question/answer tail (~100), the
  real shape of a judge batch — the engine computes the shared prefix's KV once;
* ``distinct``: every prompt differs from its first token (no prefix to share).

Wall-clock numbers suffer when other work shares the cores, so each row also gives judgments per
CPU-second of this process (all its threads); times the number of cores, that bounds what an idle
machine would do. Run one model per process (peak RSS is per process)::

    python3 -m uv run --frozen --no-sync python benchmarks/hf_engine.py --model tiny
    python3 -m uv run --frozen --no-sync python benchmarks/hf_engine.py --model embedded
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

import torch

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.hf import HFEngine
from genrm_serve.testing import build_tiny_model

INSTRUCTION = (
    "You are a strict grader. Compare the model's final answer with the reference answer. "
    "They are consistent when they denote the same mathematical object: equal numbers in any "
    "form (fractions, decimals, radicals), equivalent expressions, the same set or interval. "
    "Ignore units, formatting, and the reasoning that led to the answer. "
)


def _prompt_text(engine: HFEngine, i: int, target: int, distinct: bool) -> str:
    tail = (
        f"\nProblem {i}: compute the value of {i} * {i + 3} - {i % 7}."
        f"\nReference answer: {i * (i + 3) - i % 7}\nModel answer: the result is {i * i + 1}."
        "\nReply with 1 if consistent, 0 otherwise."
    )
    head = f"Case {i}. " if distinct else ""
    body = ""
    while len(engine.tokenizer(head + body + tail, add_special_tokens=False).input_ids) < target:
        body += INSTRUCTION
    return head + body + tail


def _requests(engine: HFEngine, n: int, target: int, distinct: bool) -> list[EngineRequest]:
    sampling = SamplingParams(temperature=0.0, max_response_len=2).merged_over(DEFAULT_SAMPLING)
    return [
        EngineRequest(
            sampling=sampling,
            messages=[Message(role="user", content=_prompt_text(engine, i, target, distinct))],
        )
        for i in range(n)
    ]


def _cpu_s() -> float:
    """CPU seconds of this process, all threads: contention-proof, unlike wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _bench(engine: HFEngine, batch: int, target: int, distinct: bool, min_s: float) -> dict:
    reqs = _requests(engine, batch, target, distinct)
    await engine.generate(reqs[: min(batch, 2)])  # warm-up
    done, t0, c0 = 0, time.perf_counter(), _cpu_s()
    prompt_tokens = 0
    while True:
        outs = await engine.generate(reqs)
        done += len(outs)
        prompt_tokens += sum(o.prompt_tokens for o in outs)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s and done >= batch:
            break
    cpu = _cpu_s() - c0
    return {
        "cpu_judgments_s": done / cpu,
        "batch": batch,
        "prompt_tokens": prompt_tokens // done,
        "judgments_s": done / elapsed,
        "prefill_tok_s": prompt_tokens / elapsed,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="'tiny', 'embedded' or a model folder")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--min-seconds", type=float, default=10.0)
    ap.add_argument("--prompts", default="shared,distinct")
    ap.add_argument(
        "--shape",
        default=None,
        help="with --model tiny: random weights of this shape, LAYERS,HIDDEN,HEADS,KV_HEADS "
        "(e.g. 36,2560,32,8 for a judge of Qwen3-4B's depth and width, on a GPU)",
    )
    args = ap.parse_args()

    model_path = args.model
    if args.model == "tiny":
        shape = dict(zip(("layers", "hidden", "heads", "kv_heads"), (2, 64, 4, 2), strict=True))
        if args.shape:
            shape = dict(zip(shape, map(int, args.shape.split(",")), strict=True))
        model_path = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", **shape))
    spec = InstanceSpec(
        route_key="bench",
        model_path=model_path,
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(max_batch_size=64, dtype=args.dtype, max_context_len=4096),
    )
    engine = HFEngine(spec, "bench/0")
    t0 = time.perf_counter()
    await engine.start()
    print(
        f"model={args.model} device={engine.device} dtype={engine.dtype} "
        f"load={time.perf_counter() - t0:.1f}s"
    )
    print("| prompts | batch | prompt tokens | judgments/s | prefill tokens/s | judgments/CPU-s |")
    print("|---|---|---|---|---|---|")
    for kind in args.prompts.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            r = await _bench(
                engine, batch, args.prompt_tokens, kind == "distinct", args.min_seconds
            )
            print(
                f"| {kind} | {r['batch']} | {r['prompt_tokens']} | {r['judgments_s']:.2f} "
                f"| {r['prefill_tok_s']:.0f} | {r['cpu_judgments_s']:.2f} |",
                flush=True,
            )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS: {peak_mb:.0f} MB")
    if engine.device.type == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


if __name__ == "__main__":
    asyncio.run(main())
