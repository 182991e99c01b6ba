"""The environment Ray must see before it starts, in one place for the CLI, launchers and tests.

Ray reads these variables when it starts, so they are set with ``setdefault`` (a user's own value
wins) before ``ray.init``. Under ``uv run``, Ray 2.60 would otherwise ship the working directory
to every worker and start each worker through ``uv run`` there (slow, ≈60 s each, or a hang
before ``serve.start()`` returns): the installed environment is enough. Token authentication
(on by default in Ray 2.60) is only turned off where asked: a throw-away local cluster of a test
or a training job, not a judge service an operator starts.
"""

from __future__ import annotations

import os

__all__ = ["LOCAL_RAY_ENV", "RAY_ENV_DEFAULTS", "apply_ray_env_defaults"]

#: Always set (unless the user set them): no usage stats, no per-worker ``uv run`` environment.
RAY_ENV_DEFAULTS: dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    # Serve kills an HTTP proxy not ready 5 s after its creation and starts another; on a node
    # busy loading models a proxy's process takes longer than that to start.
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
}

#: For a private local cluster (tests, a training job): the defaults plus no token auth.
LOCAL_RAY_ENV: dict[str, str] = {"RAY_AUTH_MODE": "disabled", **RAY_ENV_DEFAULTS}


def apply_ray_env_defaults(*, disable_auth: bool = False) -> None:
    """``os.environ.setdefault`` every Ray default; call it before Ray starts.

    ``disable_auth`` also sets ``RAY_AUTH_MODE=disabled`` (see ``LOCAL_RAY_ENV``).
    """
    for key, value in (LOCAL_RAY_ENV if disable_auth else RAY_ENV_DEFAULTS).items():
        os.environ.setdefault(key, value)
