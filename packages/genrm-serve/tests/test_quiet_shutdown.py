"""A normal exit prints no Ray warning: ``shutdown_serve`` tells Serve's controller to shut down
without waiting on a call that, by Serve's design, fails when the controller kills itself
("Task ServeController.graceful_shutdown failed ... killed by ray.kill")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = """
import ray
from ray import serve
from genrm_serve.app import shutdown_serve
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

@serve.deployment(ray_actor_options={"num_cpus": 0})
class D:
    def __call__(self, request):
        return "x"

# a Ray of its own: a plain ray.init() joins whichever cluster another test started last
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"port": 0})
serve.run(D.bind(), name="quiet")
shutdown_serve()
try:
    ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    print("CONTROLLER ALIVE")
except ValueError:
    print("CONTROLLER GONE")
serve.start(http_options={"port": 0})  # Serve starts again in the same process
shutdown_serve()
ray.shutdown()
"""


def test_shutting_serve_down_prints_no_ray_warning() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        env=os.environ | {"RAY_ADDRESS": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CONTROLLER GONE" in proc.stdout
    out = proc.stdout + proc.stderr
    for noise in ("graceful_shutdown failed", "WARNING", "Traceback"):
        assert noise not in out, out[-3000:]
