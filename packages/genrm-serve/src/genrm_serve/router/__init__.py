"""One instance's requests onto its engines, in the rooms a newcomer looks for.

- ``instance_router``: ``InstanceRouter``: admission (429 / 503), the wait for an engine slot,
  one deadline per request, the engine call and its one failover to another engine, sleep / wake.
  ``EngineSlot``: one engine as the router and the supervisor see it.
- ``policy``: which engine a request goes to, a pure function of the engines' loads and the
  request's prefix key (least loaded, or the key's home by rendezvous hashing, bounded by load).
"""

from genrm_serve.router.instance_router import (
    EngineSlot,
    InstanceRouter,
    SlotState,
    error_message,
)

__all__ = ["EngineSlot", "InstanceRouter", "SlotState", "error_message"]
