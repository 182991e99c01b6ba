"""What the judge service costs per request: HTTP + Serve + router vs calling the engine actor.

One local Ray, one Serve app with one ``__default__`` instance served by the scripted *test
engine* with no delay (it answers at once), so what is measured is the path, not a model:

* ``direct``: ``await worker.generate.remote(request)`` from this process to an engine actor of
  the same spec (what the service itself does per request);
* ``http``: ``POST /genrm/generate`` with a raw ``httpx.AsyncClient`` (client overhead is
  measured separately in ``client_overhead.py``); ``http xNp`` spreads the same load over N
  processes, because one httpx pool itself slows down past ~100 connections;
* ``batch``: ``POST /genrm/generate_batch`` with batches of 64, reported as judgments/s, beside
  ``direct-many`` (``worker.generate_many.remote`` with the same batches); ``--judge-batch``
  makes them the 64 judge prompts of ``judge_service.py`` (~1,000 tokens each) instead of one
  short line repeated.

Concurrency 1, 64 and 256 (in-flight requests from this process). Load generator, Serve proxy,
ingress and engine all share this machine's cores: read the numbers relative to each other.

    python3 -m uv run --frozen --no-sync python benchmarks/serve_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import httpx
import ray
from ray import serve

from genrm_client.types import DEFAULT_ROUTE_KEY, Message
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.worker import create_engine_worker
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import free_port

PROMPT = "Question: 1+1? Reference answer: 2. Model answer: 2. Reply 1 if consistent, else 0."
BODY = {"messages": [{"role": "user", "content": PROMPT}]}


async def _run(
    call: Callable[[], Awaitable[int]], concurrency: int, total: int
) -> tuple[float, float, float, int]:
    """Run ``total`` calls, ``concurrency`` at a time; (units/s, p50 ms, p99 ms, units)."""
    latencies: list[float] = []
    units = 0
    remaining = total

    async def worker() -> None:
        nonlocal remaining, units
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            got = await call()  # not `units += await ...`: that reads units before awaiting
            latencies.append(time.perf_counter() - t0)
            units += got

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000
    return units / elapsed, p50, p99, units


def _http_load(
    url: str, path: str, body: dict[str, Any], concurrency: int, total: int
) -> list[float]:
    """One load-generator process: ``total`` POSTs, ``concurrency`` at a time; latencies (s)."""

    async def go() -> list[float]:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as client:

            async def one() -> int:
                r = await client.post(path, json=body)
                r.raise_for_status()
                return 1

            lat: list[float] = []
            remaining = total

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    t0 = time.perf_counter()
                    await one()
                    lat.append(time.perf_counter() - t0)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return lat

    return asyncio.run(go())


def _http_multi(
    url: str,
    path: str,
    body: dict[str, Any],
    units_per_call: int,
    conc: int,
    total: int,
    procs: int,
) -> tuple[float, float, float, int]:
    """The HTTP load spread over ``procs`` processes: one httpx pool slows down past ~100
    connections (its pool is scanned per request), which would measure the client, not us."""
    with concurrent.futures.ProcessPoolExecutor(
        procs, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        list(
            pool.map(
                _http_load, [url] * procs, [path] * procs, [body] * procs, [2] * procs, [4] * procs
            )
        )
        start = time.perf_counter()
        parts = list(
            pool.map(
                _http_load,
                [url] * procs,
                [path] * procs,
                [body] * procs,
                [conc // procs] * procs,
                [total // procs] * procs,
            )
        )
        elapsed = time.perf_counter() - start
    lat = sorted(x for part in parts for x in part)
    n = len(lat) * units_per_call
    return n / elapsed, statistics.median(lat) * 1000, lat[int(0.99 * (len(lat) - 1))] * 1000, n


def _row(name: str, conc: int, res: tuple[float, float, float, int], unit: str) -> None:
    rate, p50, p99, n = res
    print(f"{name:<12} {conc:>5} {rate:>10.0f} {unit:<12} {p50:>8.1f} {p99:>8.1f} {n:>7}")


async def main_async(args: argparse.Namespace) -> None:
    instances = build_instances(
        model_path="scripted",
        engine="scripted",
        engine_config={"max_queued_requests": 4096, "max_batch_size": 64},
    )
    spec = instances[DEFAULT_ROUTE_KEY]
    port = free_port()
    sargs = ServeArgs(port=port, api_key=None, engine_num_cpus=0.1)
    deploy(build_app(instances, args=sargs), sargs)
    await asyncio.to_thread(wait_until_healthy, sargs, 120)
    worker = create_engine_worker(spec, 0, num_cpus=0.1)
    await worker.start.remote()
    request = EngineRequest(
        sampling=spec.sampling_config, messages=[Message(role="user", content=PROMPT)]
    )

    async def direct() -> int:
        await worker.generate.remote(request)
        return 1

    texts = _judge_texts() if args.judge_batch else [PROMPT] * 64
    batch_reqs = [
        EngineRequest(sampling=spec.sampling_config, messages=[Message(role="user", content=t)])
        for t in texts
    ]

    async def direct_many() -> int:
        return len(await worker.generate_many.remote(batch_reqs))

    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    async with httpx.AsyncClient(base_url=sargs.url, limits=limits, timeout=120) as client:

        async def http() -> int:
            r = await client.post("/generate", json=BODY)
            r.raise_for_status()
            return 1

        batch_body = {"requests": [{"messages": [{"role": "user", "content": t}]} for t in texts]}

        async def batch() -> int:
            r = await client.post("/generate_batch", json=batch_body)
            r.raise_for_status()
            return len(r.json()["results"])

        # Warm up both paths (connections, actor method lookups).
        await _run(http, 16, 200)
        await _run(direct, 16, 200)
        print(
            f"{'path':<12} {'conc':>5} {'rate':>10} {'':<12} {'p50 ms':>8} {'p99 ms':>8} {'n':>7}"
        )
        for conc in (1, 64, 256):
            total = args.requests if conc > 1 else max(200, args.requests // 10)
            _row("direct", conc, await _run(direct, conc, total), "req/s")
            _row("http", conc, await _run(http, conc, total), "req/s")
            if conc > 1:
                res = await asyncio.to_thread(
                    _http_multi, sargs.url, "/generate", BODY, 1, conc, total, args.procs
                )
                _row(f"http x{args.procs}p", conc, res, "req/s")
        for conc in (1, 4, 16):
            total = max(conc * 4, args.batches)
            _row("direct-many", conc, await _run(direct_many, conc, total), "judgments/s")
            _row("batch", conc, await _run(batch, conc, total), "judgments/s")
        res = await asyncio.to_thread(
            _http_multi, sargs.url, "/generate_batch", batch_body, 64, 16, args.batches, args.procs
        )
        _row(f"batch x{args.procs}p", 16, res, "judgments/s")


def _judge_texts() -> list[str]:
    """The 64 prompts of ``judge_service.py`` (8 groups x 8, 550 + 150 random tokens of the tiny
    tokenizer, decoded): a judge batch's real size on the wire."""
    from judge_service import _texts

    from genrm_serve.testing import build_tiny_tokenizer

    shape = argparse.Namespace(groups=8, group_size=8, shared=550, private=150)
    return _texts(shape, build_tiny_tokenizer())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests per point")
    parser.add_argument("--batches", type=int, default=60, help="batches of 64 per point")
    parser.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    parser.add_argument(
        "--procs", type=int, default=4, help="load-generator processes for the http xNp rows"
    )
    parser.add_argument(
        "--judge-batch", action="store_true", help="batch rows: judge-sized prompts, not one line"
    )
    args = parser.parse_args()
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        asyncio.run(main_async(args))
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
