"""The body of ``GET /genrm/health``, computed from the routers' state (never from a probe).

Rules (SPEC.md §3): with one healthy instance exactly ``{"status": "healthy", "service":
"genrm"}``; with several, plus ``"instances": {key: {"status": "healthy"}}``; when any engine is
down, HTTP 503 with every instance's detail. An instance put to sleep on purpose (defer-swap) is
not a failure: it reports ``"asleep"`` with HTTP 200.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genrm_client.types import HealthReport, InstanceHealth
from genrm_serve.router import InstanceRouter

__all__ = ["health_report", "instance_health"]


def instance_health(router: InstanceRouter) -> InstanceHealth:
    total = len(router.slots)
    healthy = router.engines_healthy
    if healthy == total and total > 0:
        if router.asleep:
            return InstanceHealth(status="asleep", engines_total=total, engines_healthy=healthy)
        return InstanceHealth(status="healthy")
    down = "; ".join(
        f"{s.engine_id}: {s.state}" + (f" ({s.detail})" if s.detail else "")
        for s in router.slots
        if not s.healthy
    )
    failed = sum(1 for s in router.slots if s.state == "failed")
    return InstanceHealth(
        status="degraded" if healthy else "unhealthy",
        engines_total=total,
        engines_healthy=healthy,
        engines_failed=failed or None,
        detail=down,
    )


def health_report(routers: Mapping[str, InstanceRouter]) -> tuple[int, dict[str, Any]]:
    """``(http_status, body)`` of the health endpoint."""
    instances = {key: instance_health(r) for key, r in routers.items()}
    ok = all(h.status in ("healthy", "asleep") for h in instances.values())
    plain = len(instances) == 1 and all(h.status == "healthy" for h in instances.values())
    report = HealthReport(
        status="healthy" if ok else "unhealthy",
        instances=None if plain else instances,
    )
    return (200 if ok else 503), report.model_dump(mode="json", exclude_none=True)
