"""Without an API key, the endpoints that change the service's state answer local callers only.

Anyone who reached an open port could put the judges to sleep (``/sleep``) or wake them, and so
take their GPUs from a training run. The rule lives in the ingress's auth middleware; here it
runs on a bare Starlette app with the caller's address set, no Ray needed.
"""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from genrm_serve.ingress import _BearerAuth


async def _ok(_request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


def _app(api_key: str | None, allow_remote_control: bool) -> Starlette:
    routes = [Route(f"/genrm{p}", _ok, methods=["POST"]) for p in ("/sleep", "/wake_up")]
    routes.append(Route("/genrm/generate", _ok, methods=["POST"]))
    app = Starlette(routes=routes, middleware=[Middleware(_BearerAuth)])
    app.state.api_key = api_key
    app.state.allow_remote_control = allow_remote_control
    return app


async def _post(app: Starlette, client: str, path: str, key: str | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=(client, 51000))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(transport=transport, base_url="http://judge") as c:
        return await c.post(path, headers=headers)


@pytest.mark.parametrize("path", ["/genrm/sleep", "/genrm/wake_up"])
async def test_a_remote_caller_without_a_key_cannot_change_the_state(path: str) -> None:
    app = _app(api_key=None, allow_remote_control=False)
    refused = await _post(app, "10.0.0.7", path)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["type"] == "forbidden"
    assert "GENRM_API_KEY" in error["message"] and "--allow-remote-control" in error["message"]
    # a local caller may (rl-core's trainer on the service's node), and judging stays open
    assert (await _post(app, "127.0.0.1", path)).status_code == 200
    assert (await _post(app, "::1", path)).status_code == 200
    assert (await _post(app, "10.0.0.7", "/genrm/generate")).status_code == 200


async def test_the_flag_or_a_key_opens_control_to_remote_callers() -> None:
    assert (await _post(_app(None, True), "10.0.0.7", "/genrm/sleep")).status_code == 200
    keyed = _app("s3cret", False)
    assert (await _post(keyed, "10.0.0.7", "/genrm/sleep", key="s3cret")).status_code == 200
    assert (await _post(keyed, "10.0.0.7", "/genrm/sleep")).status_code == 401
