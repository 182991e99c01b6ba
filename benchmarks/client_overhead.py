"""What the GenRM client costs per call: calls/s and p50/p99 latency against a trivial server.

The server (a bare ASGI app under uvicorn, in its own process) answers ``/genrm/generate`` with a
fixed body at once, so what is measured is HTTP on loopback plus the client: validation, JSON,
retry bookkeeping, the deadline. A raw ``httpx.AsyncClient`` posting the same bytes is measured
beside it, so the difference is the client's own overhead. Both processes share this machine's
cores, so read the numbers relative to each other.

    python3 -m uv run --frozen --no-sync python benchmarks/client_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from genrm_client import AsyncGenRMClient, SyncGenRMClient

MESSAGES = [{"role": "user", "content": "Question: 1+1? Reference: 2. Answer: 2. Reply 1 or 0."}]
ANSWER = json.dumps({"response": "1", "meta": {"finish_reason": "stop"}}).encode()


# ----------------------------------------------------------------------------------------------
# The trivial server (runs in a subprocess: ``--serve PORT``).


async def trivial_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    ok = scope["path"] in ("/genrm/generate", "/genrm/health")
    body = ANSWER if scope["path"] == "/genrm/generate" else b'{"status":"healthy"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200 if ok else 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(
        trivial_app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
        lifespan="off", backlog=4096,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Measurement.


@dataclass
class Row:
    client: str
    concurrency: int
    calls: int
    seconds: float
    latencies: list[float]

    def cells(self) -> list[str]:
        lat = sorted(self.latencies)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return [
            self.client,
            str(self.concurrency),
            str(self.calls),
            f"{self.calls / self.seconds:,.0f}",
            f"{statistics.median(lat) * 1e3:.2f}",
            f"{p99 * 1e3:.2f}",
        ]


async def measure(
    name: str, call: Callable[[], Awaitable[object]], concurrency: int, calls: int
) -> Row:
    for _ in range(min(concurrency, 64)):  # warm the pool and the code paths
        await call()
    latencies: list[float] = []
    remaining = iter(range(calls))

    async def worker() -> None:
        for _ in remaining:
            t0 = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Row(name, concurrency, calls, time.perf_counter() - start, latencies)


async def run_async(base: str, concurrency: int, calls: int) -> list[Row]:
    rows = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as raw:
        payload = json.dumps({"messages": MESSAGES}).encode()

        async def raw_call() -> object:
            r = await raw.post(
                f"{base}/generate", content=payload, headers={"content-type": "application/json"}
            )
            return r.json()["response"]

        rows.append(await measure("raw httpx.AsyncClient", raw_call, concurrency, calls))
    async with AsyncGenRMClient(base, max_connections=256) as client:

        async def genrm_call() -> object:
            return await client.generate(MESSAGES, {"temperature": 0.1})

        rows.append(await measure("AsyncGenRMClient.generate", genrm_call, concurrency, calls))
    return rows


def run_sync(base: str, calls: int) -> Row:
    with SyncGenRMClient(base) as client:
        for _ in range(20):
            client.generate(MESSAGES)
        latencies = []
        start = time.perf_counter()
        for _ in range(calls):
            t0 = time.perf_counter()
            client.generate(MESSAGES, {"temperature": 0.1})
            latencies.append(time.perf_counter() - t0)
        return Row("SyncGenRMClient.generate", 1, calls, time.perf_counter() - start, latencies)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the benchmark server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError(f"the benchmark server was not ready within {timeout_s:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--calls-c1", type=int, default=1000, help="calls at concurrency 1")
    parser.add_argument("--calls-c256", type=int, default=5000, help="calls at concurrency 256")
    parser.add_argument(
        "--without-sniffio-fix",
        action="store_true",
        help="undo genrm_client._compat's sniffio work-around, to measure what it saves",
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.without_sniffio_fix and sys.modules.get("sniffio", "?") is None:
        del sys.modules["sniffio"]

    port = free_port()
    base = f"http://127.0.0.1:{port}/genrm"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        wait_ready(base, proc)
        rows = asyncio.run(run_async(base, 1, args.calls_c1))
        rows.append(run_sync(base, args.calls_c1))
        rows += asyncio.run(run_async(base, 256, args.calls_c256))
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    header = ["client", "concurrency", "calls", "calls/s", "p50 ms", "p99 ms"]
    table = [header] + [r.cells() for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print(
            "  ".join(
                c.ljust(w) if j == 0 else c.rjust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
