"""Keeps every engine alive: creates, starts, probes and re-creates engine actors.

Runs as one background task in the ingress replica. Probes run concurrently, each under its own
timeout, and only ever update the slots' state: ``GET /health`` reads that state and never waits
on an engine, so a slow or dead engine cannot stall health checks or generate traffic. A dead
engine with a known placement is re-created in the same bundle after a back-off that doubles on
each failure in a row; one without (an actor someone else created) is probed until Ray restarts
it, then started again and let back in. With several ingress replicas only the leader's
supervisor creates engines; the others' find each one by name (``EngineRef.reattach``), again
after it died, and start it (a start is idempotent: they share the leader's load).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray

from genrm_serve.config import InstanceSpec
from genrm_serve.engines.remote import EngineGoneError
from genrm_serve.router import EngineSlot, InstanceRouter, error_message
from genrm_serve.serve_args import ServeArgs

__all__ = ["EngineFactory", "EngineSupervisor"]

logger = logging.getLogger(__name__)

#: Creates the actor of one slot; returns its handle (``create_engine_worker`` by default).
EngineFactory = Callable[[InstanceSpec, EngineSlot], Any]


def default_engine_factory(spec: InstanceSpec, slot: EngineSlot) -> Any:
    from genrm_serve.engines.worker import create_engine_worker

    p = slot.ref.placement
    assert p is not None
    return create_engine_worker(
        spec,
        slot.index,
        placement_group=p.placement_group,
        bundle_index=p.bundle_index,
        num_gpus=p.num_gpus,
        num_cpus=p.num_cpus,
        name=slot.ref.create_name,
    )


class EngineSupervisor:
    """Tends every slot of every instance in the background."""

    def __init__(
        self,
        routers: Mapping[str, InstanceRouter],
        args: ServeArgs,
        factory: EngineFactory = default_engine_factory,
    ) -> None:
        self.routers = routers
        self.args = args
        self.factory = factory
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="genrm-supervisor")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def kick(self, _slot: EngineSlot | None = None) -> None:
        """Look at the engines now instead of at the next period."""
        self._kick.set()

    async def stop(self) -> None:
        self._stopping = True
        tasks = [s.job for r in self.routers.values() for s in r.slots if s.job is not None]
        if self._task is not None:
            tasks.append(self._task)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    async def _loop(self) -> None:
        while not self._stopping:
            for router in self.routers.values():
                for slot in router.slots:
                    if slot.job is None or slot.job.done():
                        slot.job = asyncio.get_running_loop().create_task(
                            self._tend(router, slot), name=f"genrm-tend-{slot.engine_id}"
                        )
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.args.health_check_period_s)

    # ---- one slot ------------------------------------------------------------------------

    async def _tend(self, router: InstanceRouter, slot: EngineSlot) -> None:
        if slot.state == "failed":
            return  # its start failed after a re-creation too: not tried again
        try:
            if slot.handle is None:
                if time.monotonic() < slot.next_attempt_at:
                    return
                await self._create(router, slot)
                if slot.handle is None:  # not there yet: the leader has yet to create it
                    return
            if slot.state in ("pending", "starting"):
                await self._start(router, slot)
            else:
                await self._probe(router, slot)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # never let one engine's trouble stop the supervisor
            logger.exception("supervising engine %s failed", slot.engine_id)
            self._failed(router, slot, f"supervisor: {error_message(err)}")

    def _failed(self, router: InstanceRouter, slot: EngineSlot, detail: str) -> None:
        slot.failures_in_row += 1
        backoff = min(
            self.args.restart_backoff_max_s,
            self.args.restart_backoff_s * 2 ** (slot.failures_in_row - 1),
        )
        slot.next_attempt_at = time.monotonic() + backoff
        if slot.ref.recreatable:
            old, slot.handle = slot.handle, None
            if old is not None:
                with contextlib.suppress(Exception):
                    ray.kill(old, no_restart=True)
            router.set_state(slot, "pending", f"{detail}; re-creating in {backoff:.1f}s")
        elif slot.ref.reattach:
            slot.handle = None
            router.set_state(slot, "pending", f"{detail}; looking it up again in {backoff:.1f}s")
        else:
            router.set_state(slot, "dead", detail)

    def _give_up(self, router: InstanceRouter, slot: EngineSlot, error: str) -> None:
        """A start that fails again after a re-creation fails the same way every time (a
        missing model, a config the engine refuses, out of memory at load): say so now, with
        the engine's own error, instead of re-creating it until a caller's deadline."""
        old, slot.handle = slot.handle, None
        if old is not None:
            with contextlib.suppress(Exception):
                ray.kill(old, no_restart=True)
        logger.error("engine %s: start failed again after a re-creation: %s", slot.engine_id, error)
        router.set_state(
            slot, "failed", f"start failed again after a re-creation, not retried: {error}"
        )

    async def _create(self, router: InstanceRouter, slot: EngineSlot) -> None:
        ref = slot.ref
        if ref.handle is not None and slot.restarts == 0 and slot.failures_in_row == 0:
            slot.handle = ref.handle
        elif ref.name is not None and not ref.recreatable:
            try:  # a GCS lookup: off the event loop that serves the requests
                slot.handle = await asyncio.to_thread(ray.get_actor, ref.name, ref.namespace)
            except ValueError:  # no actor of that name (yet)
                if not ref.reattach:
                    raise
                slot.next_attempt_at = time.monotonic() + self.args.health_check_period_s
                router.set_state(slot, "pending", f"waiting for the leader to create {ref.name}")
                return
        else:
            pg = ref.placement.placement_group if ref.placement is not None else None
            if pg is not None:
                router.set_state(slot, "pending", "waiting for the placement group's resources")
                await asyncio.wait_for(pg.ready(), self.args.engine_start_timeout_s)
            if slot.failures_in_row or slot.restarts:
                slot.restarts += 1
            slot.handle = self.factory(router.spec, slot)
            slot.owned = True
        router.set_state(slot, "starting", "loading the model")

    async def _start(self, router: InstanceRouter, slot: EngineSlot) -> None:
        router.set_state(slot, "starting", "loading the model")
        try:
            await slot.actor.start(timeout_s=self.args.engine_start_timeout_s)
            if router.asleep and not slot.ref.reattach:  # its creator's call, not a follower's
                await slot.actor.sleep(timeout_s=self.args.sleep_timeout_s)
            await slot.actor.check_health(timeout_s=self.args.probe_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            if slot.failures_in_row and slot.ref.recreatable:
                self._give_up(router, slot, error_message(err))
            else:
                self._failed(router, slot, f"start failed: {error_message(err)}")
            return
        slot.failures_in_row = 0
        router.set_state(slot, "healthy", None)

    async def _probe(self, router: InstanceRouter, slot: EngineSlot) -> None:
        try:
            asleep = await slot.actor.check_health(timeout_s=self.args.probe_timeout_s)
        except asyncio.CancelledError:
            raise
        except EngineGoneError as err:
            if slot.ref.recreatable or slot.ref.reattach:
                self._failed(router, slot, f"actor died: {error_message(err)}")
            else:
                router.set_state(slot, "dead", f"actor unavailable: {error_message(err)}")
            return
        except TimeoutError:
            router.set_state(
                slot, "unhealthy", f"health probe timed out after {self.args.probe_timeout_s}s"
            )
            return
        except Exception as err:
            if slot.state == "dead" or await self._not_started(slot):
                # The actor answers again (Ray restarted it) but has not loaded its model.
                await self._start(router, slot)
            else:
                router.set_state(slot, "unhealthy", f"health probe failed: {error_message(err)}")
            return
        if slot.state == "dead":
            # Ray restarted an actor we did not create: it must load its model again.
            await self._start(router, slot)
            return
        slot.failures_in_row = 0
        router.set_state(slot, "healthy", None)
        router.engine_reports(slot, asleep=asleep)

    async def _not_started(self, slot: EngineSlot) -> bool:
        """Whether the actor is up but fresh (Ray restarted it faster than a probe period)."""
        try:
            info = await slot.actor.info(timeout_s=self.args.probe_timeout_s)
        except Exception:
            return False
        return info.get("state") == "created"
