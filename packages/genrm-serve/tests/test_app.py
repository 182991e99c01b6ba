"""``genrm_serve.app``'s own parts: the deployment's request bound, the wait for health, and
starting Serve past proxies it replaced."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from genrm_client.types import DEFAULT_ROUTE_KEY
from genrm_serve import app, limits
from genrm_serve.app import _max_ongoing, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import free_port


def test_serve_max_ongoing_requests_is_above_what_admission_lets_through() -> None:
    instances = build_instances(
        model_path="m", num_gpus=2, engine_config={"max_queued_requests": 1000}
    )
    n = _max_ongoing(instances, ServeArgs(api_key=None))
    assert n >= 2 * (2 * 64 + 1000)
    assert DEFAULT_ROUTE_KEY in instances


def test_waiting_for_health_gives_up_soon_when_nothing_answers() -> None:
    # A 503 while engines load is an answer; a proxy that is gone answers nothing, and the
    # wait must say so instead of running to the (long) engine start deadline.
    args = ServeArgs(port=free_port(), api_key=None)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing answers"):
        wait_until_healthy(args, timeout_s=600, unreachable_s=1.0, poll_s=0.1)
    assert time.monotonic() - start < 30


def test_serve_start_goes_past_proxies_serve_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    # Serve kills a proxy that was slow to start and makes another; serve.start, waiting on the
    # first, raises ActorDiedError. Starting again connects to the controller; only a proxy
    # that keeps dying is an error.
    import ray
    from ray import serve

    calls: list[dict[str, object]] = []

    def start(deaths: int) -> Callable[..., None]:
        def fake(**kw: object) -> None:
            calls.append(kw)
            if len(calls) <= deaths:
                raise ray.exceptions.ActorDiedError()

        return fake

    args = ServeArgs(port=free_port(), api_key=None)
    monkeypatch.setattr(serve, "start", start(limits.PROXY_START_ATTEMPTS - 1))
    app._start_serve(args.host, args.port)
    assert len(calls) == limits.PROXY_START_ATTEMPTS
    assert calls[-1] == {"http_options": {"host": args.host, "port": args.port}}
    calls.clear()
    monkeypatch.setattr(serve, "start", start(limits.PROXY_START_ATTEMPTS))
    with pytest.raises(ray.exceptions.ActorDiedError):
        app._start_serve(args.host, args.port)
    assert len(calls) == limits.PROXY_START_ATTEMPTS
