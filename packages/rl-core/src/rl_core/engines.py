"""Rollout and judge engines as the driver sees them, the same calls in-process or as Ray actors.

genrm-serve's engines (the ``hf`` transformers engine is both the embedded judge and the CPU
rollout engine) implement ``genrm_serve.Engine``, and genrm-serve owns every call to an engine
actor: ``genrm_serve.RemoteEngine`` (deadline, cancellation, an actor's death as one error). The
driver asks of an engine only what :class:`EngineHandle` lists; ``RemoteEngine`` has all of it,
and :class:`LocalEngineHandle` gives it for an engine object in this process (tests,
single-process CPU runs). After a weight update, :func:`check_version` makes sure the engine
serves the new weights.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from genrm_serve import Engine, EngineOutput, EngineRequest, RemoteEngine
from rl_core.limits import ENGINE_CALL_TIMEOUT_S


class StaleWeightsError(RuntimeError):
    """A rollout engine does not serve the weight version the trainer just sent."""


class EngineHandle(Protocol):
    """One rollout or judge engine as the driver sees it (``genrm_serve.RemoteEngine`` or
    :class:`LocalEngineHandle`); what a weight method returns is not read."""

    @property
    def name(self) -> str: ...

    async def generate_many(self, requests: list[EngineRequest]) -> list[EngineOutput]: ...

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    async def update_weights(self, state_dict: Any, version: int) -> object:
        """``state_dict``: the weights, or a Ray object reference to them."""
        ...

    async def update_weights_from_ipc(
        self, buckets: list[Any], version: int, done: bool
    ) -> object: ...

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None: ...

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> object: ...

    async def weight_version(self) -> int: ...

    async def state(self) -> str: ...

    async def stats(self) -> dict[str, Any]:
        """The engine's counters, state, weight version and (on CUDA) GPU memory."""
        ...


def engine_actor(handle: Any, name: str) -> RemoteEngine:
    """An engine actor (``create_engine_worker``) with rl-core's deadline on every call but the
    start (which keeps genrm-serve's)."""
    return RemoteEngine(handle, name, timeout_s=ENGINE_CALL_TIMEOUT_S)


async def check_version(engine: EngineHandle, version: int) -> None:
    """Raise :class:`StaleWeightsError` unless ``engine`` now serves ``version``."""
    served = await engine.weight_version()
    if served != version:
        raise StaleWeightsError(
            f"engine {engine.name} serves weight version {served} after an update to {version}"
        )


async def sync_weights(engine: EngineHandle, state_dict: Any, version: int) -> None:
    """Send new weights and check the engine now reports ``version``."""
    await engine.update_weights(state_dict, version)
    await check_version(engine, version)


class LocalEngineHandle:
    """An engine object in this process, with rl-core's deadline on every call."""

    def __init__(self, engine: Engine, name: str | None = None) -> None:
        self.engine = engine
        self.name = name or engine.engine_id

    async def generate_many(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        return await asyncio.wait_for(self.engine.generate(requests), ENGINE_CALL_TIMEOUT_S)

    async def sleep(self) -> None:
        await asyncio.wait_for(self.engine.sleep(), ENGINE_CALL_TIMEOUT_S)

    async def wake(self) -> None:
        await asyncio.wait_for(self.engine.wake(), ENGINE_CALL_TIMEOUT_S)

    async def update_weights(self, state_dict: Any, version: int) -> None:
        await asyncio.wait_for(
            self.engine.update_weights(state_dict, version), ENGINE_CALL_TIMEOUT_S
        )

    async def update_weights_from_ipc(self, buckets: list[Any], version: int, done: bool) -> None:
        call = self.engine.update_weights_from_ipc(buckets, version, done)
        await asyncio.wait_for(call, ENGINE_CALL_TIMEOUT_S)

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        call = self.engine.init_weight_group(host, port, rank, world_size, backend)
        await asyncio.wait_for(call, ENGINE_CALL_TIMEOUT_S)

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> None:
        call = self.engine.update_weights_from_broadcast(buckets, version)
        await asyncio.wait_for(call, ENGINE_CALL_TIMEOUT_S)

    async def weight_version(self) -> int:
        return self.engine.weight_version

    async def state(self) -> str:
        return self.engine.state

    async def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats())
