"""How the service itself is deployed: address, auth, supervision and admission knobs.

Kept apart from ``config.py`` (what each judge instance *is*) because rl-core reuses the
instance parser but chooses its own deployment settings. Every knob has the value used by
``genrm-serve run`` as its default; tests shrink the periods.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from genrm_serve import limits

__all__ = ["DEFAULT_APP_NAME", "DEFAULT_PORT", "DEFAULT_ROUTE_PREFIX", "ServeArgs"]

DEFAULT_PORT = 8000
DEFAULT_ROUTE_PREFIX = "/genrm"
DEFAULT_APP_NAME = "genrm"


#: Endpoints that change the service's state (free or restore the judges' GPU memory), under the
#: route prefix: with no API key set they answer loopback callers only.
CONTROL_PATHS = ("/sleep", "/wake_up")

#: Hosts a server bound to is reachable from this machine only.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a caller's address) is this machine only."""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _api_key_from_env() -> str | None:
    return os.environ.get("GENRM_API_KEY") or None


class ServeArgs(BaseModel):
    """Deployment settings of the GenRM Serve application."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    route_prefix: str = DEFAULT_ROUTE_PREFIX
    app_name: str = DEFAULT_APP_NAME
    #: Bearer token every request except ``GET /health`` must carry; None = no auth.
    #: Defaults to ``$GENRM_API_KEY`` where the app is built (not where the replica runs).
    api_key: str | None = Field(default_factory=_api_key_from_env)
    #: Without an api_key, the endpoints that change the service's state (``CONTROL_PATHS``:
    #: sleep, wake) answer only loopback callers (403 for others); True lets any caller in.
    allow_remote_control: bool = False

    #: Ray Serve's per-replica bound. Its default of 5 cut throughput ~10x under 32 clients;
    #: admission control is ours (per instance, 429), so Serve must never be the bottleneck.
    #: None = computed from the instances (every engine's in-flight slots plus every queue, x2).
    max_ongoing_requests: int | None = Field(default=None, gt=0)
    #: CPUs of each ingress replica (it only awaits engine actors).
    ingress_num_cpus: float = Field(default=0.1, ge=0.0)
    #: Ingress replicas: each one's HTTP handling is serial Python (~1 ms a request), so
    #: concurrent single requests (many clients' ``/generate``) scale with more. Their first
    #: (the leader) creates and re-creates the engines; every replica routes onto all of them,
    #: with an even share of each instance's admission limits.
    ingress_replicas: int = Field(default=1, ge=1)
    #: CPUs of each engine actor the service creates itself (standalone mode).
    engine_num_cpus: float = Field(default=1.0, gt=0.0)
    #: Requests one engine may hold at once (its batcher fills the next batch while one runs);
    #: None = 2 x the instance's ``max_batch_size``. Beyond it requests wait in the instance queue.
    engine_inflight_limit: int | None = Field(default=None, gt=0)

    #: How often the supervisor probes every engine, and how long one probe may take.
    health_check_period_s: float = Field(default=limits.HEALTH_CHECK_PERIOD_S, gt=0.0)
    probe_timeout_s: float = Field(default=limits.PROBE_TIMEOUT_S, gt=0.0)
    #: Deadline of one engine call (a judge request), and of an engine's start (model load).
    request_timeout_s: float = Field(default=limits.REQUEST_TIMEOUT_S, gt=0.0)
    engine_start_timeout_s: float = Field(default=limits.ENGINE_START_TIMEOUT_S, gt=0.0)
    #: Delay before re-creating a dead engine; doubles on each failure in a row, up to the max.
    restart_backoff_s: float = Field(default=limits.RESTART_BACKOFF_S, ge=0.0)
    restart_backoff_max_s: float = Field(default=limits.RESTART_BACKOFF_MAX_S, ge=0.0)
    #: Deadline of sleep / wake on every engine.
    sleep_timeout_s: float = Field(default=limits.SLEEP_TIMEOUT_S, gt=0.0)
    #: Largest request body read (413 ``request_too_large`` beyond it, before any parsing).
    max_request_body_bytes: int = Field(default=limits.MAX_REQUEST_BODY_BYTES, gt=0)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}{self.route_prefix}"
