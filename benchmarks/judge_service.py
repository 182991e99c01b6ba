"""The judge workload through the service next to the same engine in process, same weights.

The in-process number of ``hf_engine.py judge`` says what the engine can do; a reward function
gets what the service delivers. This runs one GRPO-shaped judge batch three ways and prints the
ratio of each to the first:

* ``in process``: ``HFEngine.generate`` on the 64 requests, in this process;
* ``in the engine actor``: the same call made inside the service's engine actor (its process,
  without the batcher, the Ray call or HTTP);
* ``/generate_batch``: one ``POST /genrm/generate_batch`` of the 64 (what the rewards send);
* ``/generate x64``: 64 concurrent ``POST /genrm/generate`` (what a naive client sends), from
  aiohttp and again from httpx (whose own cost per request spaces them out).

``--small-batches 1,8`` adds in-process rows for the first k requests alone: a small batch's
cost is what a burst's first engine batch costs. ``--ingress-replicas 2,4`` adds rows of the
service deployed again with that many ingress replicas over the same engine.

Both service paths go through the real stack: HTTP, Serve's proxy, the ingress, the router and
the engine actor's micro-batcher, with the engine in its own process. The prompts are chat
messages (the service's input), so the template is in both paths: ``--groups`` groups of
``--group-size`` samples, each ``--shared`` random tokens of its group's then ``--private`` of
its own, decoded to text. One output token, greedy. Beside each row: the engine batches that
served it and the prompt tokens its packed prefill shared (the engine actor's counters), and
when a call's first and last request reached the engine actor's queue.

``--serve-mode throughput`` runs the service in Ray Serve's high-throughput mode (HAProxy in
front, throughput-optimized replicas) instead of behind its Python HTTP proxy.

The model is a random-weight folder of ``--shape`` (bf16 on a GPU, fp32 on CPU), or
``--model PATH|embedded``::

    python benchmarks/judge_service.py --shape qwen3-4b                   # one GPU
    python benchmarks/judge_service.py --shape qwen3-4b --serve-mode throughput
    python benchmarks/judge_service.py --model embedded --shared 100 --private 25 --groups 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import aiohttp
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
from genrm_serve.engines.worker import create_engine_worker
from genrm_serve.models import resolve_model_path
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import free_port

SAMPLING = {"temperature": 0.0, "max_response_len": 1}


def _model_folder(args: argparse.Namespace) -> str:
    """A random-weight folder of ``--shape`` (hf_engine.py's model, its weights written out),
    or the given model."""
    if args.model:
        return str(resolve_model_path(args.model))
    if args.model_dir and (Path(args.model_dir) / "config.json").exists():
        return str(args.model_dir)  # written by an earlier run
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folder, model = _random_model_dir(args.shape, device)
    if args.model_dir:  # kept for the next run (another --serve-mode, say)
        shutil.copytree(folder, args.model_dir, dirs_exist_ok=True)
        folder = Path(args.model_dir)
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


def _in_process(
    spec: InstanceSpec, texts: list[str], repeats: int, small: list[int]
) -> list[tuple[str, float, dict[str, int]]]:
    """The batch of all ``texts``, then (``small``) batches of their first k alone: what a
    batch of a few requests costs when nothing else runs in the process."""
    engine = HFEngine(spec, "judge/in-process")
    asyncio.run(engine.start())
    sampling = spec.sampling_config

    def batch_of(some: list[str]) -> Callable[[], Awaitable[None]]:
        async def once() -> None:
            reqs = [
                EngineRequest(sampling=sampling, messages=[Message(role="user", content=t)])
                for t in some
            ]
            outs = await engine.generate(reqs)
            assert len(outs) == len(some)

        return once

    rows: list[tuple[str, float, dict[str, int]]] = []
    for k in [len(texts), *small]:
        before = engine.stats()
        wall, _ = asyncio.run(_timed_calls(batch_of(texts[:k]), repeats))
        counters = _deltas(before, engine.stats()) | {"n": k}
        name = "in process: HFEngine.generate" + (f", the first {k} alone" if rows else "")
        rows.append((name, wall, counters))
    asyncio.run(engine.shutdown())
    return rows


#: The engine's counters each row reports, per batch of 64: its generate calls, its packed
#: prefills, the prompt tokens they shared and the tokens they computed; then the milliseconds
#: it spent on the prompts (checks, template, tokenizer) and on the model.
COUNTERS = ("batches", "chunks", "prefix_shared_tokens", "forward_tokens")
BUSY = ("busy_prompts_s", "busy_compute_s")


def _deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    out = {k: int(after.get(k, 0) - before.get(k, 0)) for k in COUNTERS}
    out |= {k: int(1e3 * (after.get(k, 0.0) - before.get(k, 0.0))) for k in BUSY}
    return out


#: Ray Serve's own high-throughput mode (its docs, Ray >= 2.55): HAProxy in place of the Python
#: HTTP proxy, and the throughput-optimized replica (user code on the replica's own event loop).
#: Read where Ray Serve is imported, so set before this process imports it.
THROUGHPUT_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def _record_arrivals(actor: Any) -> None:
    """In the engine actor: note when each call's requests reach its queue, and when each engine
    batch ran (wall clock, the same clock as this process on one machine) with the CPU time of
    the thread that ran it: a batch whose wall time is far over its CPU time and its GPU work
    waited, for the GPU or for the GIL held by the actor's intake."""
    submit = actor._submit
    generate = actor.engine._generate
    actor.arrivals, actor.batches = [], []

    def recorded(requests: list[EngineRequest]) -> Any:
        actor.arrivals.append((time.time(), len(requests)))
        return submit(requests)

    def timed(requests: list[EngineRequest]) -> Any:
        start, cpu = time.time(), time.thread_time()
        try:
            return generate(requests)
        finally:
            actor.batches.append((start, time.time(), len(requests), time.thread_time() - cpu))

    actor._submit = recorded
    actor.engine._generate = timed


def _take_arrivals(
    actor: Any,
) -> tuple[list[tuple[float, int]], list[tuple[float, float, int, float]]]:
    out = (list(actor.arrivals), list(actor.batches))
    actor.arrivals, actor.batches = [], []
    return out


def _set_batch_wait(actor: Any, wait_s: float, wait_max_s: float) -> None:
    actor.batch_wait_s, actor.batch_wait_max_s = wait_s, wait_max_s


@contextlib.contextmanager
def _gil_profile(pid: int, path: str | None) -> Iterator[None]:
    """py-spy on the engine actor's process ``pid``, sampling only the thread that holds the GIL
    (raw stacks per thread, to ``path``): which of the compute thread and the event loop's
    intake has it."""
    if path is None:
        yield
        return
    command = ["py-spy", "record", "--gil", "--threads", "--nonblocking", "-r", "1000", "-f", "raw"]
    spy = subprocess.Popen([*command, "-p", str(pid), "-o", path], stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


def _set_switch_interval(_actor: Any, seconds: float) -> float:
    """The engine actor's GIL switch interval (Python's default is 5 ms): how long its compute
    thread may wait for the GIL, after a kernel launch, while the event loop runs Python."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    return before


async def _timed_calls(
    fn: Callable[[], Awaitable[Any]], repeats: int, worker: Any = None
) -> tuple[float, dict[str, Any]]:
    """Median wall of ``repeats`` calls after a warm-up. With the engine actor ``worker``, also
    when the requests of a call reached it (the median over calls of the first and the last
    arrival, ms after the call began) and the engine batches of the last call (ms after it
    began: start-end, rows)."""
    await fn()
    if worker is not None:
        await worker.__ray_call__.remote(_take_arrivals)
    walls, first, last = [], [], []
    timeline = ""
    for _ in range(repeats):
        t0 = time.time()
        await fn()
        walls.append(time.time() - t0)
        if worker is None:
            continue
        arrivals, batches = await worker.__ray_call__.remote(_take_arrivals)
        first.append(1e3 * (arrivals[0][0] - t0))
        last.append(1e3 * (arrivals[-1][0] - t0))
        timeline = ", ".join(
            f"{1e3 * (a - t0):.0f}-{1e3 * (b - t0):.0f}: {n} (cpu {1e3 * cpu:.0f})"
            for a, b, n, cpu in batches
        )
    if worker is None:
        return statistics.median(walls), {}
    out: dict[str, Any] = {"first_arrival_ms": int(statistics.median(first))}
    out["last_arrival_ms"] = int(statistics.median(last))
    out["timeline"] = timeline
    return statistics.median(walls), out


#: The engine actor the benchmark hands the service.
ENGINE_NAME = "judge-service-bench-0"


def _service(
    spec: InstanceSpec,
    texts: list[str],
    repeats: int,
    waits: list[tuple[float, float]],
    switch_intervals: list[float],
    profile: str | None,
    replicas: list[int],
) -> list[tuple[str, float, dict[str, Any]]]:
    ray.init(num_gpus=1 if torch.cuda.is_available() else 0, include_dashboard=False)
    # The engine is made here and handed to the service (as rl-core does), so that the service
    # can be deployed again with more ingress replicas over the same loaded engine.
    gpus = 1.0 if torch.cuda.is_available() else 0.0
    worker = create_engine_worker(spec, 0, num_gpus=gpus, num_cpus=1.0, name=ENGINE_NAME)
    ray.get(worker.start.remote(), timeout=900)
    ray.get(worker.__ray_call__.remote(_record_arrivals))
    port = free_port()

    def serve_with(replicas: int) -> str:
        sargs = ServeArgs(port=port, api_key=None, ingress_replicas=replicas)
        app = build_app({"judge": spec}, engines={"judge": [ENGINE_NAME]}, args=sargs)
        deploy(app, sargs)
        wait_until_healthy(sargs, 900)
        return sargs.url

    bodies = [{"messages": [{"role": "user", "content": t}], "route_key": "judge"} for t in texts]
    url = serve_with(1)
    rows = [_in_actor(worker, spec, texts, repeats)]
    rows += asyncio.run(_http_paths(url, bodies, worker, repeats, waits, switch_intervals, profile))
    for n in replicas:
        url = serve_with(n)
        more = asyncio.run(_http_paths(url, bodies, worker, repeats, waits, [], None, core=True))
        rows += [(f"{name}, {n} ingress replicas", wall, c) for name, wall, c in more]
    serve.shutdown()
    ray.shutdown()
    return rows


async def _http_paths(
    url: str,
    bodies: list[dict[str, Any]],
    worker: Any,
    repeats: int,
    waits: list[tuple[float, float]],
    switch_intervals: list[float],
    profile: str | None,
    *,
    core: bool = False,
) -> list[tuple[str, float, dict[str, Any]]]:
    """The HTTP paths, each through one client kept open across its calls (as a reward
    function keeps its client): the warm-up call opens the connections. ``core``: only
    ``/generate_batch`` and the concurrent ``/generate`` from aiohttp.

    The 64 concurrent ``/generate`` go out twice: from aiohttp, which sends them in ~0.3 ms of
    CPU each, and from httpx, whose pool scans every connection per request (~8 ms of CPU each
    at 64 connections on the 2-core machine): there the client, not the service, spaces the
    requests out."""
    actor_s: list[float] = []  # per call: the longest time a request spent in the engine actor
    n = len(bodies)
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    rows = []
    async with (
        httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=n)) as session,
    ):

        async def batch() -> None:
            r = await client.post("/generate_batch", json={"requests": bodies})
            r.raise_for_status()
            results = r.json()["results"]
            assert all("response" in x for x in results), r.text[:500]
            actor_s.append(max(x["meta"]["engine_latency_s"] for x in results))

        async def one(body: dict[str, Any]) -> dict[str, Any]:
            async with session.post(url + "/generate", json=body) as r:
                r.raise_for_status()
                out: dict[str, Any] = await r.json()
                return out

        async def concurrent() -> None:
            outs = await asyncio.gather(*(one(b) for b in bodies))
            actor_s.append(max(o["meta"]["engine_latency_s"] for o in outs))

        async def concurrent_httpx() -> None:
            rs = await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))
            for r in rs:
                r.raise_for_status()
            actor_s.append(max(r.json()["meta"]["engine_latency_s"] for r in rs))

        paths: list[tuple[str, Any, dict[str, Any]]] = [
            ("/generate_batch", batch, {}),
            (f"/generate x{n}", concurrent, {"profile": profile}),
        ]
        if not core:
            paths.append((f"/generate x{n}, httpx client", concurrent_httpx, {}))
        paths += [
            (
                f"/generate x{n}, batch wait {w * 1e3:g} ms, at most {m * 1e3:g}",
                concurrent,
                {"wait": (w, m)},
            )
            for w, m in waits
        ]
        paths += [
            (
                f"/generate x{n}, engine's GIL switch interval {s * 1e3:g} ms",
                concurrent,
                {"switch": s},
            )
            for s in switch_intervals
        ]
        default = await worker.__ray_call__.remote(lambda a: (a.batch_wait_s, a.batch_wait_max_s))
        pid = await worker.__ray_call__.remote(lambda _actor: os.getpid())
        for name, fn, settings in paths:
            await worker.__ray_call__.remote(_set_batch_wait, *settings.get("wait", default))
            if "switch" in settings:
                switch = await worker.__ray_call__.remote(_set_switch_interval, settings["switch"])
            before = await worker.stats.remote()
            with _gil_profile(pid, settings.get("profile")):
                wall, counters = await _timed_calls(fn, repeats, worker)
            counters |= _deltas(before, await worker.stats.remote())
            counters["actor_ms"] = int(1e3 * statistics.median(actor_s[-repeats:]))
            actor_s.clear()
            rows.append((name, wall, counters))
            if "switch" in settings:
                await worker.__ray_call__.remote(_set_switch_interval, switch)
    return rows


def _in_actor(
    worker: Any, spec: InstanceSpec, texts: list[str], repeats: int
) -> tuple[str, float, dict[str, int]]:
    """The engine's own batch call, timed inside the engine actor: the same work as in process,
    in the actor's process, without the batcher, the Ray call or HTTP. It says whether a gap
    between the service and in process comes from the process the engine runs in or from the
    path to it."""

    def run(actor: Any, texts: list[str], sampling: Any, repeats: int) -> tuple[float, dict]:
        engine = actor.engine

        def once() -> float:
            reqs = [
                EngineRequest(sampling=sampling, messages=[Message(role="user", content=t)])
                for t in texts
            ]
            t0 = time.perf_counter()
            outs = engine._generate(reqs)
            assert len(outs) == len(texts)
            return time.perf_counter() - t0

        before = engine.stats()
        once()
        wall = statistics.median(once() for _ in range(repeats))
        return wall, _deltas(before, engine.stats())

    wall, counters = ray.get(worker.__ray_call__.remote(run, texts, spec.sampling_config, repeats))
    return "in the engine actor: HFEngine._generate, called there", wall, counters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="a model folder or 'embedded' (not --shape)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--shared", type=int, default=550)
    ap.add_argument("--private", type=int, default=150)
    ap.add_argument(
        "--model-dir",
        default=None,
        help="where the random-weight model of --shape is written, or read if already there",
    )
    ap.add_argument(
        "--batch-waits",
        default="",
        help="more rows of the concurrent /generate with other batcher waits: "
        "'WAIT_MS:MAX_MS,...' (the engine actor's batch_wait_s / batch_wait_max_s)",
    )
    ap.add_argument(
        "--small-batches",
        default="",
        help="more in-process rows: batches of the first k requests alone, 'k,...'",
    )
    ap.add_argument(
        "--switch-intervals",
        default="",
        help="more rows of the concurrent /generate with the engine actor's GIL switch "
        "interval set to each of these, 'MS,...' (Python's default is 5 ms)",
    )
    ap.add_argument(
        "--profile-engine",
        default=None,
        help="py-spy the engine actor's GIL holder during the concurrent /generate calls, "
        "raw stacks per thread to this file",
    )
    ap.add_argument(
        "--ingress-replicas",
        default="",
        help="more rows of /generate_batch and the concurrent /generate, the service deployed "
        "again with each of these numbers of ingress replicas over the same engine, 'N,...'",
    )
    ap.add_argument(
        "--serve-mode",
        default="proxy",
        choices=("proxy", "throughput"),
        help="proxy: Ray Serve's default HTTP proxy; throughput: its high-throughput mode "
        "(HAProxy, throughput-optimized replicas)",
    )
    args = ap.parse_args()
    if args.serve_mode == "throughput" and any(
        os.environ.get(k) != v for k, v in THROUGHPUT_ENV.items()
    ):
        # Read where Ray and Serve are imported, this process included: start again with them.
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **THROUGHPUT_ENV})

    from transformers import AutoTokenizer

    folder = _model_folder(args)
    texts = _texts(args, AutoTokenizer.from_pretrained(folder))
    spec = _spec(folder)
    waits = [
        (float(w) / 1e3, float(m) / 1e3)
        for w, m in (p.split(":") for p in args.batch_waits.split(",") if p)
    ]
    small = [int(k) for k in args.small_batches.split(",") if k]
    switch_intervals = [float(ms) / 1e3 for ms in args.switch_intervals.split(",") if ms]
    replicas = [int(r) for r in args.ingress_replicas.split(",") if r]
    n = len(texts)
    calls = args.repeats + 1
    print(
        f"judge through the service: {args.model or args.shape}, {args.groups} groups x "
        f"{args.group_size}, {args.shared} shared + {args.private} private tokens before the "
        f"template, 1 output token, device={'cuda' if torch.cuda.is_available() else 'cpu'}, "
        f"Serve: {args.serve_mode}"
    )
    in_process = _in_process(spec, texts, args.repeats, small)
    base = in_process[0][1]
    gc.collect()  # the in-process engine's memory, before the service's engine loads
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    rows = [
        *in_process,
        *_service(
            spec, texts, args.repeats, waits, switch_intervals, args.profile_engine, replicas
        ),
    ]
    print(
        "| path | judgments/s | ms per batch | vs in process | engine calls | packed prefills "
        "| tokens shared | tokens computed | ms in the engine actor | engine ms: prompts "
        "| engine ms: model | ms to the engine: first / last request |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, wall, c in rows:
        per = {k: c[k] / calls for k in (*COUNTERS, *BUSY)}
        k = c.get("n", n)  # judgments per call
        print(
            f"| {name} | {k / wall:.1f} | {wall * 1e3:.0f} | {k * base / (n * wall):.2f}x "
            f"| {per['batches']:.1f} | {per['chunks']:.1f} | {per['prefix_shared_tokens']:.0f} "
            f"| {per['forward_tokens']:.0f} | {c.get('actor_ms', '-')} "
            f"| {per['busy_prompts_s']:.0f} | {per['busy_compute_s']:.0f} "
            f"| {c.get('first_arrival_ms', '-')} / {c.get('last_arrival_ms', '-')} |",
            flush=True,
        )
    print("\nengine batches of each path's last call (ms after the call began: start-end, rows):")
    for name, _wall, c in rows:
        if c.get("timeline"):
            print(f"- {name}: {c['timeline']}")


if __name__ == "__main__":
    main()
