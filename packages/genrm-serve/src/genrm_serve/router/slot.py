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
from genrm_serve.engines.base import engine_id_for
from genrm_serve.engines.remote import RemoteEngine

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
    #: The face every call to the engine actor goes through; None while there is no actor.
    _actor: RemoteEngine | None = field(default=None, init=False, repr=False)

    @property
    def engine_id(self) -> str:
        return engine_id_for(self.route_key, self.index)

    @property
    def actor(self) -> RemoteEngine:
        """Every call to this slot's engine actor goes through it."""
        if self._actor is None:
            raise RuntimeError(f"engine {self.engine_id} has no actor now")
        return self._actor

    @property
    def handle(self) -> Any:
        """The Ray actor handle (to kill the actor), None while there is none. Setting it gives
        the slot that actor: its face is made once, here."""
        return None if self._actor is None else self._actor.handle

    @handle.setter
    def handle(self, handle: Any) -> None:
        self._actor = None if handle is None else RemoteEngine(handle, self.engine_id)

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
