"""The judge workload through the service next to the same engine in process, same weights.

The in-process number of ``hf_engine.py judge`` says what the engine can do; a reward function
gets what the service delivers. This runs one GRPO-shaped judge batch three ways and prints the
ratio of each to the first:

* ``in process``: ``HFEngine.generate`` on the 64 requests, in this process;
* ``/generate_batch``: one ``POST /genrm/generate_batch`` of the 64 (what the rewards send);
* ``/generate x64``: 64 concurrent ``POST /genrm/generate`` (what a naive client sends).

Both service paths go through the real stack: HTTP, Serve's proxy, the ingress, the router and
the engine actor's micro-batcher, with the engine in its own process. The prompts are chat
messages (the service's input), so the template is in both paths: ``--groups`` groups of
``--group-size`` samples, each ``--shared`` random tokens of its group's then ``--private`` of
its own, decoded to text. One output token, greedy. Beside each row: the engine batches that
served it and the prompt tokens its packed prefill shared (the engine actor's counters).

The model is a random-weight folder of ``--shape`` (bf16 on a GPU, fp32 on CPU), or
``--model PATH|embedded``::

    python benchmarks/judge_service.py --shape qwen3-4b                   # one GPU
    python benchmarks/judge_service.py --model embedded --shared 100 --private 25 --groups 4
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import httpx
import ray
import torch
from ray import serve

sys.path.insert(0, str(Path(__file__).parent))
from hf_engine import SHAPES, _judge_prompts, _random_model_dir

from genrm_client.types import Message, SamplingParams
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.hf import HFEngine
from genrm_serve.models import resolve_model_path
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import free_port

SAMPLING = {"temperature": 0.0, "max_response_len": 1}


def _model_folder(args: argparse.Namespace) -> str:
    """A random-weight folder of ``--shape`` (hf_engine.py's model, its weights written out),
    or the given model."""
    if args.model:
        return str(resolve_model_path(args.model))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder, model = _random_model_dir(args.shape, device)
    model.save_pretrained(folder)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return str(folder)


def _texts(args: argparse.Namespace, tokenizer: Any) -> list[str]:
    """The judge prompts as text: random tokens of the tokenizer's own vocabulary, decoded."""
    vocab = min(len(tokenizer), 50_000)
    special = set(tokenizer.all_special_ids)
    ids = _judge_prompts(
        args.groups, args.group_size, args.shared, args.private, vocab, distinct=False
    )
    return [tokenizer.decode([t for t in p if t not in special]) for p in ids]


def _spec(folder: str) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=folder,
        num_gpus=1,  # on a machine without GPUs the engine asks Ray for none
        engine="hf",
        engine_config=EngineConfig(max_batch_size=64),
        sampling_config=SamplingParams(**SAMPLING).merged_over(DEFAULT_SAMPLING),
    )


def _median_wall(fn: Callable[[], Awaitable[Any]], repeats: int) -> float:
    """Median seconds of ``repeats`` calls after one warm-up call."""

    async def go() -> float:
        await fn()
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await fn()
            walls.append(time.perf_counter() - t0)
        return statistics.median(walls)

    return asyncio.run(go())


def _in_process(spec: InstanceSpec, texts: list[str], repeats: int) -> tuple[float, dict[str, int]]:
    engine = HFEngine(spec, "judge/in-process")
    asyncio.run(engine.start())
    sampling = spec.sampling_config

    async def once() -> None:
        reqs = [
            EngineRequest(sampling=sampling, messages=[Message(role="user", content=t)])
            for t in texts
        ]
        outs = await engine.generate(reqs)
        assert len(outs) == len(texts)

    before = engine.stats()
    wall = _median_wall(once, repeats)
    counters = _deltas(before, engine.stats())
    asyncio.run(engine.shutdown())
    return wall, counters


#: The engine's counters each row reports, per batch of 64: its generate calls, its packed
#: prefills, the prompt tokens they shared and the tokens they computed; then the milliseconds
#: it spent on the prompts (checks, template, tokenizer) and on the model.
COUNTERS = ("batches", "chunks", "prefix_shared_tokens", "forward_tokens")
BUSY = ("busy_prompts_s", "busy_compute_s")


def _deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    out = {k: int(after.get(k, 0) - before.get(k, 0)) for k in COUNTERS}
    out |= {k: int(1e3 * (after.get(k, 0.0) - before.get(k, 0.0))) for k in BUSY}
    return out


def _service(
    spec: InstanceSpec, texts: list[str], repeats: int
) -> list[tuple[str, float, dict[str, int]]]:
    ray.init(num_gpus=1 if torch.cuda.is_available() else 0, include_dashboard=False)
    sargs = ServeArgs(port=free_port(), api_key=None, engine_num_cpus=1.0)
    deploy(build_app({"judge": spec}, args=sargs), sargs)
    wait_until_healthy(sargs, 900)
    bodies = [{"messages": [{"role": "user", "content": t}], "route_key": "judge"} for t in texts]
    rows = []
    with httpx.Client(base_url=sargs.url, timeout=600) as sync_client:
        (slot,) = sync_client.get("/engines").json()["instances"]["judge"]
    worker = ray.get_actor(slot["actor_name"], namespace=slot["namespace"])
    actor_s: list[float] = []  # per call: the longest time a request spent in the engine actor

    async def batch() -> None:
        async with httpx.AsyncClient(base_url=sargs.url, timeout=600) as client:
            r = await client.post("/generate_batch", json={"requests": bodies})
            r.raise_for_status()
            results = r.json()["results"]
            assert all("response" in x for x in results), r.text[:500]
            actor_s.append(max(x["meta"]["engine_latency_s"] for x in results))

    async def concurrent() -> None:
        limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
        async with httpx.AsyncClient(base_url=sargs.url, timeout=600, limits=limits) as client:
            rs = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
            for r in rs:
                r.raise_for_status()
            actor_s.append(max(r.json()["meta"]["engine_latency_s"] for r in rs))

    for name, fn in (("/generate_batch", batch), (f"/generate x{len(texts)}", concurrent)):
        before = ray.get(worker.stats.remote())
        wall = _median_wall(fn, repeats)
        after = ray.get(worker.stats.remote())
        counters = _deltas(before, after)
        counters["actor_ms"] = int(1e3 * statistics.median(actor_s[-repeats:]))
        actor_s.clear()
        rows.append((name, wall, counters))
    serve.shutdown()
    ray.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="a model folder or 'embedded' (not --shape)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--shared", type=int, default=550)
    ap.add_argument("--private", type=int, default=150)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    folder = _model_folder(args)
    texts = _texts(args, AutoTokenizer.from_pretrained(folder))
    spec = _spec(folder)
    n = len(texts)
    calls = args.repeats + 1
    print(
        f"judge through the service: {args.model or args.shape}, {args.groups} groups x "
        f"{args.group_size}, {args.shared} shared + {args.private} private tokens before the "
        f"template, 1 output token, device={'cuda' if torch.cuda.is_available() else 'cpu'}"
    )
    base, counters = _in_process(spec, texts, args.repeats)
    gc.collect()  # the in-process engine's memory, before the service's engine loads
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    rows = [("in process: HFEngine.generate", base, counters), *_service(spec, texts, args.repeats)]
    print(
        "| path | judgments/s | ms per batch | vs in process | engine calls | packed prefills "
        "| tokens shared | tokens computed | ms in the engine actor | engine ms: prompts "
        "| engine ms: model |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, wall, c in rows:
        per = {k: c[k] / calls for k in (*COUNTERS, *BUSY)}
        print(
            f"| {name} | {n / wall:.1f} | {wall * 1e3:.0f} | {base / wall:.2f}x "
            f"| {per['batches']:.1f} | {per['chunks']:.1f} | {per['prefix_shared_tokens']:.0f} "
            f"| {per['forward_tokens']:.0f} | {c.get('actor_ms', '-')} "
            f"| {per['busy_prompts_s']:.0f} | {per['busy_compute_s']:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
