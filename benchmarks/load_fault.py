"""Load with a fault: does the judge service lose requests when an engine dies under load?

One local Ray on loopback, one Serve app with one instance served by N scripted *test engines*
(created by the service in its own placement group, as ``genrm-serve run`` does), and
genrm-client sending ``--requests`` ``/generate`` calls with ``--concurrency`` in flight from
this process (one client, one connection pool, its real retry policy). Optionally, once
``--fault-at`` of the requests have completed, one fault:

* ``kill-engine``: SIGKILL one engine actor's process (the supervisor re-creates it);
* ``sleep``: ``POST /sleep`` the instance, ``POST /wake_up`` ``--sleep-s`` later;
* ``stop-service``: delete the Serve app (every later request must fail typed, none hang).

Every call ends as one of: ``ok`` (the engine's known reply), a typed ``GenRMError`` (counted
by class), or ``lost`` (anything else: another exception, or a wrong reply). Reported: req/s,
p50 / p99 latency of the ok calls (retries included), client retries (attempts beyond the
first, counted at the transport), and the RSS of Ray's processes (proxy, ingress, engines,
raylet, GCS) before and after. Bounded: ``--max-seconds`` stops sending, and calls still in
flight then are cancelled and counted as ``unfinished``.

    python3 -m uv run --frozen --no-sync python benchmarks/load_fault.py \\
        --requests 10000 --concurrency 512 --engines 2 --fault kill-engine
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import httpx
import ray
from ray import serve

from genrm_client import AsyncGenRMClient, GenRMError
from genrm_client.types import DEFAULT_ROUTE_KEY
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import free_port

REPLY = "1"
USER = {"role": "user", "content": "Is 3+4=7 consistent with the reference 7? Reply 1 or 0."}
FAULTS = ("none", "kill-engine", "sleep", "stop-service")


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport, counting attempts per call (the client's ``X-Request-ID``)."""

    def __init__(self, max_connections: int) -> None:
        self.inner = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            )
        )
        self.attempts: Counter[str] = Counter()
        #: What each attempt got: an HTTP status, or the transport error's name.
        self.answers: Counter[str] = Counter()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts[request.headers.get("x-request-id", "")] += 1
        try:
            response = await self.inner.handle_async_request(request)
        except Exception as err:
            self.answers[type(err).__name__] += 1
            raise
        self.answers[str(response.status_code)] += 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def retries(self) -> int:
        return sum(n - 1 for n in self.attempts.values())


def _ray_rss_mb() -> float:
    """RSS of every descendant of this process (Ray's processes), in MB."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
    family: set[int] = set()
    frontier = {os.getpid()}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - family
        family |= frontier
    total_kb = 0
    for pid in family:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


async def _fault(kind: str, args: ServeArgs, sleep_s: float) -> str:
    async with httpx.AsyncClient(timeout=60) as http:
        if kind == "kill-engine":
            engines = (await http.get(f"{args.url}/engines")).json()["instances"]
            victim = engines[DEFAULT_ROUTE_KEY][0]
            actor = ray.get_actor(victim["actor_name"], namespace=victim["namespace"])
            pid = await actor.__ray_call__.remote(lambda _self: os.getpid())
            os.kill(pid, signal.SIGKILL)
            return f"SIGKILL engine {victim['engine_id']} (pid {pid})"
        if kind == "sleep":
            t0 = time.monotonic()
            r = await http.post(f"{args.url}/sleep", json={})
            await asyncio.sleep(sleep_s)
            w = await http.post(f"{args.url}/wake_up", json={})
            return (
                f"sleep {r.status_code} / wake_up {w.status_code} after "
                f"{time.monotonic() - t0:.1f}s"
            )
        if kind == "stop-service":
            await asyncio.to_thread(serve.delete, args.app_name)
            return "Serve app deleted"
    return "none"


async def _load(ns: argparse.Namespace, args: ServeArgs) -> dict[str, Any]:
    transport = CountingTransport(ns.concurrency)
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    fault_note = "none"
    fault_task: asyncio.Task[str] | None = None
    fault_after = int(ns.requests * ns.fault_at) if ns.fault != "none" else -1
    done = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(ns.requests):
        queue.put_nowait(i)
    stop_sending = time.monotonic() + ns.max_seconds

    async with AsyncGenRMClient(
        args.url, max_retries=ns.max_retries, timeout=ns.timeout, transport=transport
    ) as client:

        async def one() -> None:
            nonlocal done, fault_task
            start = time.monotonic()
            try:
                text = await client.generate([USER])
            except GenRMError as err:
                outcomes[type(err).__name__] += 1
            except asyncio.CancelledError:
                outcomes["unfinished"] += 1
                raise
            except Exception as err:
                outcomes["lost"] += 1
                outcomes[f"lost:{type(err).__name__}"] += 1
            else:
                if text == REPLY:
                    outcomes["ok"] += 1
                    latencies.append(time.monotonic() - start)
                else:
                    outcomes["lost"] += 1
                    outcomes["lost:wrong_reply"] += 1
            done += 1
            if done == fault_after and fault_task is None:
                fault_task = asyncio.create_task(_fault(ns.fault, args, ns.sleep_s))

        async def worker() -> None:
            while time.monotonic() < stop_sending:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await one()

        t0 = time.monotonic()
        workers = [asyncio.create_task(worker()) for _ in range(ns.concurrency)]
        _done, pending = await asyncio.wait(workers, timeout=ns.max_seconds + ns.timeout)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        wall = time.monotonic() - t0
        if fault_task is not None:
            fault_note = await fault_task
    outcomes["not_sent"] = queue.qsize()
    lat = sorted(latencies)
    return {
        "requests": ns.requests,
        "concurrency": ns.concurrency,
        "engines": ns.engines,
        "fault": ns.fault,
        "fault_note": fault_note,
        "wall_s": round(wall, 1),
        "req_per_s": round(sum(v for k, v in outcomes.items() if ":" not in k) / wall, 1),
        "p50_s": round(statistics.median(lat), 3) if lat else None,
        "p99_s": round(lat[int(0.99 * (len(lat) - 1))], 3) if lat else None,
        "client_retries": transport.retries,
        "attempt_answers": dict(transport.answers),
        "outcomes": dict(outcomes),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=512)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--fault", choices=FAULTS, default="none")
    p.add_argument("--fault-at", type=float, default=0.3, help="fraction of requests done")
    p.add_argument("--sleep-s", type=float, default=3.0, help="how long --fault sleep lasts")
    p.add_argument("--engine-delay-s", type=float, default=0.005, help="scripted time per batch")
    p.add_argument("--max-retries", type=int, default=3, help="client retries (its default)")
    p.add_argument("--timeout", type=float, default=120.0, help="client deadline per call")
    p.add_argument("--max-seconds", type=float, default=900.0, help="stop sending after this")
    p.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    ns = p.parse_args()
    if not 0 < ns.fault_at < 1:
        p.error(f"--fault-at={ns.fault_at} must be in (0, 1)")

    script = json.dumps({"default": REPLY, "delay_s": ns.engine_delay_s})
    instances = build_instances(
        model_path=f"scripted:{script}", num_gpus=ns.engines, engine="scripted"
    )
    args = ServeArgs(port=free_port(), api_key=None, engine_num_cpus=0.1)
    ray.init(address="local", num_cpus=ns.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        deploy(build_app(instances, args=args), args)
        wait_until_healthy(args, 300)
        rss_before = _ray_rss_mb()
        result = asyncio.run(_load(ns, args))
        result["ray_rss_mb_before"] = round(rss_before)
        result["ray_rss_mb_after"] = round(_ray_rss_mb())
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    text = json.dumps(result, indent=2)
    print(text)
    if ns.json is not None:
        ns.json.write_text(text + "\n")
    o = result["outcomes"]
    typed = sum(
        v
        for k, v in o.items()
        if k not in ("ok", "lost", "not_sent", "unfinished") and not k.startswith("lost:")
    )
    print(
        f"| {result['fault']} | {result['requests']} @ {result['concurrency']} | "
        f"{o.get('ok', 0)} | {typed} | {o.get('lost', 0)} | {result['req_per_s']} | "
        f"{result['p50_s']} / {result['p99_s']} | {result['client_retries']} | "
        f"{result['ray_rss_mb_before']} → {result['ray_rss_mb_after']} |"
    )
    return 0 if o.get("lost", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
