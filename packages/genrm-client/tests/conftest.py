"""A scriptable stand-in of the GenRM service's HTTP API, served by uvicorn on a loopback port.

The client is tested over real HTTP (sockets, keep-alive, pool limits, real timeouts), not against
a mock transport. This stand-in speaks genrm-serve's wire schema; integration tests use the real
service once it exists. It answers ``/generate`` by echoing the last message, and a test can queue
scripted answers (status, body, headers, delay) per path and read what the server saw.

Test modules cannot import this file (pytest's importlib mode), so they get everything through
the fixtures and import ``StandIn`` only for type checking.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from genrm_client import _retry, close_genrm_clients
from genrm_client.types import DEFAULT_ROUTE_KEY


@dataclass
class Scripted:
    """One queued answer."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def unknown_route_body(route_key: str, registered: list[str]) -> dict[str, Any]:
    return {
        "error": {
            "type": "unknown_route_key",
            "message": f"No GenRM instance registered for route_key={route_key}",
            "route_key": route_key,
            "registered_route_keys": registered,
        }
    }


class StandIn:
    """State and behaviour of the stand-in service; reset before every test."""

    def __init__(self) -> None:
        self.url = ""
        self.reset()

    def reset(self) -> None:
        self.registered = [DEFAULT_ROUTE_KEY, "quality", "safety"]
        self.hits: Counter[str] = Counter()
        self.hit_times: defaultdict[str, list[float]] = defaultdict(list)
        self.bodies: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.client_ports: set[int] = set()
        self.scripts: defaultdict[str, deque[Scripted]] = defaultdict(deque)
        self.delay_s = 0.0
        self.inflight = 0
        self.max_inflight = 0
        self.healthy = True

    def queue(
        self,
        path: str,
        status: int = 200,
        body: Any = None,
        headers: dict[str, str] | None = None,
        *,
        delay_s: float = 0.0,
        times: int = 1,
    ) -> None:
        """Queue ``times`` scripted answers on ``path``; status 200 without body = default answer.

        A ``str`` body is sent as text, anything else as JSON.
        """
        answer = Scripted(status, body, headers or {}, delay_s)
        self.scripts[path].extend([answer] * times)

    def answer_one(self, req: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        route_key = req.get("route_key") or DEFAULT_ROUTE_KEY
        if route_key not in self.registered:
            return 404, unknown_route_body(route_key, self.registered)
        text = f"echo:{req['messages'][-1]['content']}"
        meta = {"route_key": route_key, "finish_reason": "stop", "completion_tokens": 1}
        return 200, {"response": text, "meta": meta}

    async def handle(self, request: Request) -> Response:
        path = request.url.path.removeprefix("/genrm")
        self.hits[path] += 1
        self.hit_times[path].append(time.monotonic())
        self.headers.append(dict(request.headers))
        if request.client is not None:
            self.client_ports.add(request.client.port)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            body = await request.json() if request.method == "POST" else None
            self.bodies.append(body)
            script = self.scripts[path].popleft() if self.scripts[path] else None
            delay = script.delay_s if script is not None else self.delay_s
            if delay:
                await asyncio.sleep(delay)
            if script is not None and (script.status != 200 or script.body is not None):
                if isinstance(script.body, str):
                    return PlainTextResponse(script.body, script.status, script.headers)
                return JSONResponse(script.body, script.status, script.headers)
            return self.default(path, body)
        finally:
            self.inflight -= 1

    def default(self, path: str, body: Any) -> Response:
        if path == "/generate":
            status, answer = self.answer_one(body)
            return JSONResponse(answer, status)
        if path == "/generate_batch":
            results = [self.answer_one(r)[1] for r in body["requests"]]
            return JSONResponse({"results": results})
        if path == "/health":
            if self.healthy:
                return JSONResponse({"status": "healthy", "service": "genrm"})
            report = {
                "status": "unhealthy",
                "service": "genrm",
                "instances": {"quality": {"status": "unhealthy", "detail": "engine died"}},
            }
            return JSONResponse(report, 503)
        if path == "/metrics":
            return PlainTextResponse('genrm_requests_total{route_key="__default__"} 3\n')
        return JSONResponse({"error": {"type": "not_found", "message": path}}, 404)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _serve(standin: StandIn) -> Iterator[StandIn]:
    paths = ["/genrm/generate", "/genrm/generate_batch", "/genrm/health", "/genrm/metrics"]
    methods = {"/genrm/health": ["GET"], "/genrm/metrics": ["GET"]}
    app = Starlette(
        routes=[Route(p, standin.handle, methods=methods.get(p, ["POST"])) for p in paths]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the stand-in server did not start within 10 s")
        time.sleep(0.01)
    standin.url = f"http://127.0.0.1:{sock.getsockname()[1]}/genrm"
    try:
        yield standin
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="session")
def _standin_session() -> Iterator[StandIn]:
    yield from _serve(StandIn())


@pytest.fixture
def server(_standin_session: StandIn) -> StandIn:
    """The running stand-in, reset to its default behaviour."""
    _standin_session.reset()
    return _standin_session


@pytest.fixture
def refused_url() -> str:
    """A base URL on a loopback port where nothing listens."""
    return f"http://127.0.0.1:{free_port()}/genrm"


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Exponential backoff of 10 ms so retries run fast; records each retry's attempt number.

    Only the backoff is replaced: a server's Retry-After is still honoured as sent.
    """
    calls: list[int] = []

    def fast(attempt: int, **_: Any) -> float:
        calls.append(attempt)
        return 0.01

    monkeypatch.setattr(_retry, "backoff_delay", fast)
    return calls


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GENRM_* from the developer's shell leaks in; no singleton leaks in or out (another
    package's tests in the same process, e.g. a pytest-xdist worker's earlier file, may have
    left one for a service that is gone)."""
    for name in ("GENRM_URL", "GENRM_TIMEOUT_S", "GENRM_MAX_RETRIES", "GENRM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GENRM_MAX_CONNECTIONS", raising=False)
    asyncio.run(close_genrm_clients())
    yield
    asyncio.run(close_genrm_clients())
