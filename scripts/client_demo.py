"""A short tour of genrm-client against a local stand-in of the judge service.

Until the real main job lands (the GenRM service on Ray Serve plus training), README command (1)
runs this: it starts a tiny *stand-in* service on a free loopback port — it speaks the real wire
schema but its "judge" is a string comparison, not a model — and uses the real client to call
health, generate (with and without a route_key, and an unknown one), generate_many and metrics.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections import Counter
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from genrm_client import AsyncGenRMClient, UnknownRouteKeyError

INSTANCES = ["__default__", "quality", "safety"]
served: Counter[str] = Counter()


def stand_in_judge(prompt: str) -> str:
    """Reply "1" when the answer after 'Answer:' equals the reference, else "0" (no model)."""
    ref = re.search(r"Reference:\s*(.+)", prompt)
    ans = re.findall(r"Answer:\s*(.+)", prompt)
    same = ref is not None and bool(ans) and ans[-1].strip() == ref.group(1).strip()
    return "1" if same else "0"


async def generate(request: Request) -> JSONResponse:
    body: dict[str, Any] = await request.json()
    route_key = body.get("route_key") or "__default__"
    if route_key not in INSTANCES:
        error = {
            "type": "unknown_route_key",
            "message": f"No GenRM instance registered for route_key={route_key}",
            "route_key": route_key,
            "registered_route_keys": INSTANCES,
        }
        return JSONResponse({"error": error}, 404)
    served[route_key] += 1
    text = stand_in_judge(body["messages"][-1]["content"])
    meta = {"route_key": route_key, "finish_reason": "stop", "completion_tokens": 1}
    return JSONResponse({"response": text, "meta": meta})


async def health(_: Request) -> JSONResponse:
    instances = {k: {"status": "healthy"} for k in INSTANCES}
    return JSONResponse({"status": "healthy", "service": "genrm", "instances": instances})


async def metrics(_: Request) -> PlainTextResponse:
    lines = ["# TYPE genrm_requests_total counter"]
    lines += [f'genrm_requests_total{{route_key="{k}"}} {served[k]}' for k in INSTANCES]
    return PlainTextResponse("\n".join(lines) + "\n")


app = Starlette(
    routes=[
        Route("/genrm/generate", generate, methods=["POST"]),
        Route("/genrm/health", health),
        Route("/genrm/metrics", metrics),
    ]
)


def start_stand_in() -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the stand-in service did not start within 10 s")
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}/genrm", server, thread


def judge_prompt(question: str, reference: str, answer: str) -> list[dict[str, str]]:
    content = (
        "Is the model's answer consistent with the reference answer? Reply 1 or 0.\n"
        f"Question: {question}\nReference: {reference}\nAnswer: {answer}"
    )
    return [{"role": "user", "content": content}]


async def tour(url: str) -> None:
    async with AsyncGenRMClient(url, timeout=10) as client:
        print(f"client: {client!r}")
        report = await client.health()
        print(f"health: {report.status}; instances: {', '.join(report.instances or {})}")

        text = await client.generate(judge_prompt("1+1?", "2", "2"), {"temperature": 0.1})
        print(f"generate (default judge): {text!r}")
        full = await client.generate_full(judge_prompt("2*3?", "6", "5"), route_key="quality")
        meta = full.meta.model_dump(exclude_none=True) if full.meta else {}
        print(f"generate_full (route_key=quality): {full.response!r}, meta={meta}")

        try:
            await client.generate(judge_prompt("?", "1", "1"), route_key="qualty")
        except UnknownRouteKeyError as err:
            print(f"unknown route_key -> {type(err).__name__}: {err}")

        samples = [("3+4?", "7", a) for a in ("7", "8", "seven", "7")]
        requests = [
            {"messages": judge_prompt(*s), "route_key": rk}
            for s, rk in zip(samples, ["quality", "safety", "quality", "safety"], strict=True)
        ]
        results = await client.generate_many(requests, concurrency=4)
        print("generate_many (4 requests, in input order):")
        for (q, ref, ans), req, res in zip(samples, requests, results, strict=True):
            print(f"  {req['route_key']:>8}: {q} ref={ref} answer={ans!r:8} -> {res.response}")

        print("metrics:")
        for line in (await client.metrics()).splitlines():
            print(f"  {line}")


def main() -> None:
    start = time.monotonic()
    url, server, thread = start_stand_in()
    print(f"stand-in GenRM service (no model: a string comparison) at {url}")
    try:
        asyncio.run(tour(url))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    print(f"done in {time.monotonic() - start:.1f} s")


if __name__ == "__main__":
    main()
