"""A rollout engine whose actor dies is re-created, as genrm-serve's supervisor re-creates a
judge engine: a lost engine costs the step a delay, not the run.

:class:`RecoverableEngine` stands where the :class:`~genrm_serve.RemoteEngine` of a rollout
engine stood (the trainer, the phases, the weight sync hold it). A call that finds the actor gone
(``EngineGoneError``: killed, OOM, crashed) re-creates it in the same bundle of the plan, starts
it, brings it to the state the old one was in (the last weight version it was sent, asleep or
awake), and makes the call again. A group's requests are all one call, and a group's samples are
filled only from its answer, so the step ends with every sample once. Concurrent calls that meet
the same death share one re-creation. An engine that is alive but marked itself failed
(``EngineFailedError``: its wake check found weights that did not survive a sleep) is ended and
re-created the same way: it must not serve again. An engine whose node was lost (Ray cannot
reach it, or says its node died) is not: its bundle went with the node, and so did the trainer
ranks and judge engines there, so the death is raised and the run restarts from its checkpoint
once the cluster can hold the plan again (``rl_core.restarts``).

Weights reach the new engine through the object store (rank 0's state dict, as
:class:`~rl_core.weight_sync.ObjectStoreSync` sends them): only the object-store weight path
recovers an engine (a broadcast group or CUDA IPC would have to be formed again with the new
actor); on the other paths, and in fully-async (where rank 0 trains the next version while
the engines generate, so its weights are not the version the engine served), the death is
raised as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from genrm_serve import (
    EngineFailedError,
    EngineGoneError,
    EngineOutput,
    EngineRequest,
    RemoteEngine,
)

__all__ = ["RecoverableEngine", "engine_restarts", "node_lost"]

logger = logging.getLogger(__name__)

#: Makes a fresh engine actor in the dead one's bundle, started: ``await factory(attempt)``.
EngineFactory = Callable[[int], Awaitable[RemoteEngine]]
#: Rank 0's weights (an object-store reference), for a re-created engine.
WeightSource = Callable[[], Awaitable[Any]]

#: What Ray's ``ActorDiedError`` says of an actor whose node died (it has no field for it).
NODE_DIED = "its node has died"

#: Re-creations of one engine within one call before its death is raised (it dies as it starts).
MAX_RECREATIONS_PER_CALL = 2


class RecoverableEngine:
    """One rollout engine that is re-created when its actor dies (module docstring)."""

    def __init__(self, engine: RemoteEngine, factory: EngineFactory) -> None:
        self.engine = engine
        self.factory = factory
        #: where a re-created engine takes its weights from (set once the trainer is up); None:
        #: deaths are not recovered (a weight path other than the object store)
        self.weights: WeightSource | None = None
        #: re-creations so far (the step metrics' ``rollout/engine_restarts`` are the deltas)
        self.restarts = 0
        self._version = 0
        self._asleep = False
        self._recovering: asyncio.Future[None] | None = None

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def handle(self) -> Any:
        return self.engine.handle

    def __repr__(self) -> str:
        return f"RecoverableEngine({self.name!r}, restarts={self.restarts})"

    # ---- recovery ------------------------------------------------------------------------------

    async def _recover(self, dead: RemoteEngine, err: EngineGoneError | EngineFailedError) -> None:
        if self._recovering is not None:  # someone else met this death first
            await asyncio.shield(self._recovering)
            return
        if self.engine is not dead:  # already replaced since this call started
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._recovering = done
        try:
            await self._recreate(err)
            done.set_result(None)
        except BaseException as e:
            done.set_exception(e)
            raise
        finally:
            self._recovering = None
            if done.done() and not done.cancelled():
                done.exception()  # retrieved: no "never retrieved" warning if nobody waits

    async def _recreate(self, err: EngineGoneError | EngineFailedError) -> None:
        assert self.weights is not None
        t0 = time.monotonic()
        if isinstance(err, EngineFailedError):  # alive, holding its bundle: end it first
            logger.warning("rollout engine %s failed (%s): replacing it", self.name, err)
            await self.engine.kill()
        else:
            logger.warning(
                "rollout engine %s lost (%s): re-creating it in its bundle", self.name, err.cause
            )
        fresh = await self.factory(self.restarts + 1)
        if self._version:
            await fresh.update_weights(await self.weights(), self._version)
            served = await fresh.weight_version()
            if served != self._version:
                raise RuntimeError(
                    f"re-created rollout engine {self.name} serves weight version {served}, "
                    f"not {self._version}"
                )
        if self._asleep:
            await fresh.sleep()
        self.engine = fresh
        self.restarts += 1
        logger.warning(
            "rollout engine %s re-created in %.1f s (restart %d, weights v%d, %s); its "
            "requests are sent again",
            self.name,
            time.monotonic() - t0,
            self.restarts,
            self._version,
            "asleep" if self._asleep else "awake",
        )

    async def _do(self, call: Callable[[RemoteEngine], Awaitable[Any]]) -> Any:
        for attempt in range(MAX_RECREATIONS_PER_CALL + 1):
            engine = self.engine
            try:
                return await call(engine)
            except (EngineGoneError, EngineFailedError) as err:
                if self.weights is None or attempt == MAX_RECREATIONS_PER_CALL:
                    raise
                if isinstance(err, EngineGoneError) and node_lost(err.cause):
                    logger.warning(
                        "rollout engine %s lost with its node (%s): not re-created in place",
                        self.name,
                        err.cause,
                    )
                    raise
                await self._recover(engine, err)
        raise AssertionError("unreachable")

    # ---- EngineHandle ----------------------------------------------------------------------------

    async def generate_many(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        out: list[EngineOutput] = await self._do(lambda e: e.generate_many(requests))
        return out

    async def sleep(self) -> None:
        await self._do(lambda e: e.sleep())
        self._asleep = True

    async def wake(self) -> None:
        await self._do(lambda e: e.wake())
        self._asleep = False

    async def update_weights(self, state_dict: Any, version: int) -> object:
        out = await self._do(lambda e: e.update_weights(state_dict, version))
        self._version = version
        return out

    async def update_weights_from_ipc(self, buckets: list[Any], version: int, done: bool) -> object:
        out = await self.engine.update_weights_from_ipc(buckets, version, done)
        if done:
            self._version = version
        return out

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        await self.engine.init_weight_group(host, port, rank, world_size, backend)

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> object:
        out = await self.engine.update_weights_from_broadcast(buckets, version)
        self._version = version
        return out

    async def weight_version(self) -> int:
        return int(await self._do(lambda e: e.weight_version()))

    async def state(self) -> str:
        return str(await self._do(lambda e: e.state()))

    async def stats(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return dict(await self._do(lambda e: e.stats(timeout_s=timeout_s)))

    async def info(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        return dict(await self._do(lambda e: e.info(timeout_s=timeout_s)))

    async def shutdown(self) -> None:
        """The engine ended in order (nothing re-created: the run is done with it)."""
        await self.engine.shutdown()

    async def kill(self) -> None:
        """End the engine for good (nothing re-created): a restart in place replaces it."""
        await self.engine.kill()


def node_lost(cause: BaseException) -> bool:
    """Whether Ray's error for a gone actor says its node is gone, or cannot be reached (Ray
    declares a silent node dead only after its health checks miss, seconds later)."""
    from ray.exceptions import ActorUnavailableError

    return isinstance(cause, ActorUnavailableError) or NODE_DIED in str(cause)


def engine_restarts(engines: Any) -> int:
    """Re-creations so far over ``engines`` (0 for engines that are not recoverable)."""
    return sum(int(getattr(e, "restarts", 0)) for e in engines)
