"""The tests' local Ray + Serve: a free port taken before Serve's proxy binds it is not a failure
of the module's tests (it failed 14 of them once, on a busy machine)."""

from __future__ import annotations

import socket

import httpx
import pytest

from genrm_serve import app, testing
from genrm_serve.config import InstanceSpec
from genrm_serve.serve_args import ServeArgs


def test_a_port_taken_before_the_proxy_binds_it_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        offered = iter([busy])  # the first "free" port: held by another process by now
        real = app.free_port
        monkeypatch.setattr(app, "free_port", lambda host: next(offered, None) or real(host))
        with testing.local_ray_serve(num_cpus=1) as port:
            assert port != busy
            # Serve's proxy answers on the port it got (404: no app deployed)
            assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 404


def test_a_serve_already_running_on_another_port_is_refused_and_left_running() -> None:
    """``serve.start`` on a running Serve ignores the port asked: a second service would answer
    on a port nothing listens on, and its shutdown would end the first Serve's apps."""
    with testing.local_ray_serve(num_cpus=1) as port:
        with pytest.raises(app.ServeRunningError, match=f"its HTTP proxy on port {port}:"):
            app.start_proxy("127.0.0.1")  # a free port: any other than the running one
        other = app.free_port("127.0.0.1")
        with pytest.raises(app.ServeRunningError, match=f"of its own on port {other};"):
            judge = InstanceSpec(
                route_key="judge", model_path='scripted:{"default": "1"}', num_gpus=1
            )
            args = ServeArgs(port=other)
            app.deploy(app.build_app({"judge": judge}, args=args), args)
        # the running Serve's own port is no other Serve: starting there connects to it
        assert app.start_proxy("127.0.0.1", port) == port
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 404
