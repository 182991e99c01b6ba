"""One instance's requests onto its engines, in the rooms a newcomer looks for.

- ``instance_router``: ``InstanceRouter``: admission (429 / 503), the wait for an engine slot,
  one deadline per request, the engine call and its one failover to another engine, sleep / wake.
  ``EngineSlot``: one engine as the router and the supervisor see it.
- ``policy``: which engine a prefix key belongs to (rendezvous hashing, bounded by load).
"""

from genrm_serve.router.instance_router import (
    EngineSlot,
    InstanceRouter,
    SlotState,
    error_message,
)

__all__ = ["EngineSlot", "InstanceRouter", "SlotState", "error_message"]
