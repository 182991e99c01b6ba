"""The tests' local Ray + Serve: a free port taken before Serve's proxy binds it is not a failure
of the module's tests (it failed 14 of them once, on a busy machine)."""

from __future__ import annotations

import socket

import httpx
import pytest

from genrm_serve import app, testing


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
