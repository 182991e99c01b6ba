"""One instance's requests onto its engines; a module for each part of the job:

- ``instance_router``: ``InstanceRouter``: admission (429 / 503), the wait for an engine slot,
  one deadline per request, the engine call and its one failover to another engine, sleep / wake.
- ``slot``: ``EngineSlot``: one engine as the router and the supervisor see it.
- ``policy``: which engine a request goes to, a pure function of the engines' loads and the
  request's prefix key (least loaded, or the key's home by rendezvous hashing, bounded by load).
- ``coalescing``: single requests given to one engine in one turn of the event loop go out as
  one engine call.
- ``chunking``: a batch cut into engine calls that keep each prefix key's requests together.
"""

from genrm_serve.router.instance_router import InstanceRouter, error_message
from genrm_serve.router.slot import EngineSlot, SlotState

__all__ = ["EngineSlot", "InstanceRouter", "SlotState", "error_message"]
