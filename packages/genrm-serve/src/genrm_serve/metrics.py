"""Prometheus metrics of the service, labelled by route_key.

One registry per ingress (not the process-global one), so that a test or a second app in the
same process never sees "duplicated timeseries". Counters move as requests finish; gauges (in
flight, queued, engines, asleep) are read from the routers at scrape time, so they can never
drift from the state that routing actually uses.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from genrm_serve.router import InstanceRouter

__all__ = ["CONTENT_TYPE", "OUTCOMES", "ServiceMetrics"]

#: Outcomes a finished request is counted under (``genrm_requests_total{outcome=...}``).
OUTCOMES = (
    "success",
    "prompt_too_long",
    "overloaded",
    "engine_unavailable",
    "instance_asleep",
    "timeout",
    "error",
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ServiceMetrics:
    """The service's metrics and their text exposition."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "genrm_requests",
            "Judge requests finished, by route_key and outcome",
            ["route_key", "outcome"],
            registry=r,
        )
        self.unknown_route_key = Counter(
            "genrm_unknown_route_key_requests",
            "Requests naming a route_key no instance is registered for (answered 404)",
            registry=r,
        )
        self.latency = Histogram(
            "genrm_request_latency_seconds",
            "Time from admission to answer of one judge request",
            ["route_key"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "genrm_prompt_tokens", "Prompt tokens judged", ["route_key"], registry=r
        )
        self.completion_tokens = Counter(
            "genrm_completion_tokens", "Completion tokens generated", ["route_key"], registry=r
        )
        self.in_flight = Gauge(
            "genrm_requests_in_flight", "Requests on an engine now", ["route_key"], registry=r
        )
        self.queued = Gauge(
            "genrm_requests_queued",
            "Requests waiting for an engine slot now (bounded by max_queued_requests)",
            ["route_key"],
            registry=r,
        )
        self.engines_total = Gauge(
            "genrm_engines_total", "Engines of the instance", ["route_key"], registry=r
        )
        self.engines_healthy = Gauge(
            "genrm_engines_healthy", "Engines passing their health probe", ["route_key"], registry=r
        )
        self.asleep = Gauge(
            "genrm_instance_asleep",
            "1 while the instance is asleep, 0 awake",
            ["route_key"],
            registry=r,
        )
        self.restarts = Gauge(
            "genrm_engine_restarts", "Engines re-created since start", ["route_key"], registry=r
        )
        self.affinity = Gauge(
            "genrm_affinity_requests",
            "Requests with a prefix_key since start, by where they were routed: 'home' (the "
            "key's engine) or 'spilled' (to the least-loaded engine: the key's was busier)",
            ["route_key", "routed"],
            registry=r,
        )

    def prime(self, route_keys: list[str]) -> None:
        """Create every labelled series at 0, so dashboards see them before the first request."""
        for key in route_keys:
            for outcome in OUTCOMES:
                self.requests.labels(route_key=key, outcome=outcome)
            self.latency.labels(route_key=key)
            self.prompt_tokens.labels(route_key=key)
            self.completion_tokens.labels(route_key=key)

    def observe(
        self,
        route_key: str,
        outcome: str,
        latency_s: float,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        self.requests.labels(route_key=route_key, outcome=outcome).inc()
        self.latency.labels(route_key=route_key).observe(latency_s)
        if prompt_tokens:
            self.prompt_tokens.labels(route_key=route_key).inc(prompt_tokens)
        if completion_tokens:
            self.completion_tokens.labels(route_key=route_key).inc(completion_tokens)

    def render(self, routers: Mapping[str, InstanceRouter]) -> bytes:
        for key, router in routers.items():
            self.in_flight.labels(route_key=key).set(router.in_flight)
            self.queued.labels(route_key=key).set(router.queued)
            self.engines_total.labels(route_key=key).set(len(router.slots))
            self.engines_healthy.labels(route_key=key).set(router.engines_healthy)
            self.asleep.labels(route_key=key).set(1 if router.asleep else 0)
            self.restarts.labels(route_key=key).set(sum(s.restarts for s in router.slots))
            self.affinity.labels(route_key=key, routed="home").set(router.affinity_home)
            self.affinity.labels(route_key=key, routed="spilled").set(router.affinity_spilled)
        return generate_latest(self.registry)
