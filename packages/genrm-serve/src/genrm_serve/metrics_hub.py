"""The metrics of several ingress replicas, added up: what one scrape of ``/metrics`` sees.

Behind a load balancer a scrape reaches one replica at random, and one replica's counters alone
would jump from scrape to scrape. Every replica publishes its own exposition to one small named
actor (every ``PUBLISH_PERIOD_S`` when it changed, and at once before it answers a scrape); the
replica that answers adds them up. Counters, histograms and the request gauges (in flight,
queued) are summed; the engine gauges, which every replica reads off the same engines, take the
largest value; a series' creation time, the earliest. Another replica's share is at most one
period old.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["MetricsPublisher", "merge_expositions"]

logger = logging.getLogger(__name__)

#: How stale another replica's share of a scrape may be (seconds).
PUBLISH_PERIOD_S = 1.0

#: Gauges every replica reads off the same engines: the largest, not the sum.
_SHARED_GAUGES = frozenset(
    {
        "genrm_engines_total",
        "genrm_engines_healthy",
        "genrm_instance_asleep",
        "genrm_engine_restarts",
    }
)


def merge_expositions(texts: list[bytes]) -> bytes:
    """Prometheus text of the replicas' expositions added up (see the module's rules)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            into = values.setdefault(merged.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in into:
                    into[key] = sample.value
                elif sample.name.endswith("_created"):
                    into[key] = min(into[key], sample.value)
                elif family.name in _SHARED_GAUGES:
                    into[key] = max(into[key], sample.value)
                else:
                    into[key] += sample.value
    for name, family in families.items():
        family.samples = [Sample(s, dict(labels), v) for (s, labels), v in values[name].items()]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    """A collector of metric families already computed."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class _Hub:
    """The latest exposition of every replica, by rank (a restarted replica takes its rank's)."""

    def __init__(self) -> None:
        self._texts: dict[int, bytes] = {}

    def publish(self, rank: int, text: bytes) -> list[bytes]:
        self._texts[rank] = text
        return list(self._texts.values())


_HubActor: Any = ray.remote(num_cpus=0)(_Hub)


class MetricsPublisher:
    """One replica's side: publishes its exposition, and answers a scrape with everyone's."""

    def __init__(self, app_name: str, rank: int, render: Callable[[], bytes]) -> None:
        self.name = f"genrm-metrics:{app_name}"
        self.rank = rank
        self.render = render
        self._last: bytes | None = None
        self._handle: Any = None
        self._task: asyncio.Task[None] | None = None

    async def _hub(self, again: bool = False) -> Any:
        # Owned by the replica that made it first; if that one goes, the next publish makes
        # another, which every replica fills again within a period. Finding or creating it is a
        # GCS call: off the event loop.
        if self._handle is None or again:
            options = _HubActor.options(name=self.name, get_if_exists=True)
            self._handle = await asyncio.to_thread(options.remote)
        return self._handle

    async def _publish(self, text: bytes) -> list[bytes]:
        try:
            texts: list[bytes] = await (await self._hub()).publish.remote(self.rank, text)
        except ray.exceptions.RayActorError:  # its owner went away: make it again
            texts = await (await self._hub(again=True)).publish.remote(self.rank, text)
        self._last = text
        return texts

    async def scrape(self) -> bytes:
        """Every replica's metrics added up (this one's as of now)."""
        return merge_expositions(await self._publish(self.render()))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="genrm-metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_PERIOD_S)
            text = self.render()
            if text != self._last:
                try:
                    await self._publish(text)
                except Exception as err:  # the next period tries again
                    logger.warning("publishing this replica's metrics failed: %s", err)
