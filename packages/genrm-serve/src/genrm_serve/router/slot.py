"""One engine as the router and the supervisor see it: its state, its load, its actor.

The supervisor writes a slot's health (``state``, ``detail``, ``asleep``) and its actor; the
router reads them to choose (``policy``) and writes ``in_flight``. One object for both, so that
``GET /health`` and the metrics read the same state the requests are routed on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from genrm_serve.engine_refs import EngineRef
from genrm_serve.engines.actor import EngineActor
from genrm_serve.engines.base import engine_id_for

__all__ = ["EngineSlot", "SlotState"]

#: pending: no actor yet (being created, or waiting out the restart back-off); starting: the
#: actor exists and loads its model; healthy: serving; unhealthy: a probe failed; dead: the
#: actor is gone; failed: its start failed again after a re-creation (a missing model, a config
#: the engine refuses, out of memory at load): it is not re-created again.
SlotState = Literal["pending", "starting", "healthy", "unhealthy", "dead", "failed"]


@dataclass
class EngineSlot:
    """The service's view of one engine actor."""

    route_key: str
    index: int
    ref: EngineRef
    handle: Any = None
    state: SlotState = "pending"
    in_flight: int = 0
    detail: str | None = "not started yet"
    restarts: int = 0
    failures_in_row: int = 0
    next_attempt_at: float = 0.0
    #: The service created this actor (standalone, or a re-creation): it kills it on shutdown.
    owned: bool = False
    #: Asleep at its last health probe.
    asleep: bool = False
    #: Has been healthy once: a later outage is a restart, which requests wait out.
    served: bool = False
    job: asyncio.Task[None] | None = field(default=None, repr=False)
    _actor: EngineActor | None = field(default=None, repr=False)

    @property
    def engine_id(self) -> str:
        return engine_id_for(self.route_key, self.index)

    @property
    def actor(self) -> EngineActor:
        """Every call to this slot's engine actor goes through it (one per actor handle)."""
        if self._actor is None or self._actor.handle is not self.handle:
            self._actor = EngineActor(self.handle, self.engine_id)
        return self._actor

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"

    @property
    def reviving(self) -> bool:
        """Down, but the supervisor brings it back (re-created, or looked up again once the
        leader re-created it): a request may wait for it instead of failing."""
        return (
            self.served
            and self.state in ("pending", "starting", "dead")
            and (self.ref.recreatable or self.ref.reattach)
        )
