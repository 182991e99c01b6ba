"""Handles on rollout and judge engines, the same calls whether in-process or Ray actors.

genrm-serve's engines (the ``hf`` transformers engine is both the embedded judge and the CPU
rollout engine) implement ``genrm_serve.engines.base.Engine``. The driver talks to them only
through :class:`EngineHandle`: generate, sleep / wake, weight updates with a version check. A
local handle wraps an engine object (tests, single-process CPU runs); a Ray handle wraps an
engine actor and awaits its ObjectRefs — never a blocking ``ray.get`` in async code.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Any

from genrm_serve import Engine, EngineOutput, EngineRequest
from rl_core.limits import ENGINE_CALL_TIMEOUT_S


class StaleWeightsError(RuntimeError):
    """A rollout engine does not serve the weight version the trainer just sent."""


class EngineHandle(ABC):
    """One rollout or judge engine as the driver sees it."""

    name: str

    @abstractmethod
    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]: ...

    @abstractmethod
    async def sleep(self) -> None: ...

    @abstractmethod
    async def wake(self) -> None: ...

    @abstractmethod
    async def update_weights(self, state_dict: Any, version: int) -> None:
        """``state_dict``: the weights, or a Ray object reference to them."""

    @abstractmethod
    async def weight_version(self) -> int: ...

    @abstractmethod
    async def state(self) -> str: ...

    @abstractmethod
    async def stats(self) -> dict[str, Any]:
        """The engine's counters, state, weight version and (on CUDA) GPU memory."""

    async def update_weights_from_ipc(self, buckets: list[Any], version: int, done: bool) -> None:
        """Flat buckets shared through CUDA IPC by the trainer rank on this engine's GPU."""
        raise NotImplementedError(f"engine {self.name}: no CUDA IPC weight path")

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        raise NotImplementedError(f"engine {self.name}: no weight-broadcast path")

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> None:
        raise NotImplementedError(f"engine {self.name}: no weight-broadcast path")

    async def check_version(self, version: int) -> None:
        """Raise :class:`StaleWeightsError` unless the engine now serves ``version``."""
        served = await self.weight_version()
        if served != version:
            raise StaleWeightsError(
                f"engine {self.name} serves weight version {served} after an update to {version}"
            )

    async def sync_weights(self, state_dict: Any, version: int) -> None:
        """Send new weights and check the engine now reports ``version``."""
        await self.update_weights(state_dict, version)
        await self.check_version(version)


class LocalEngineHandle(EngineHandle):
    """An engine object in this process."""

    def __init__(self, engine: Engine, name: str | None = None) -> None:
        self.engine = engine
        self.name = name or engine.engine_id

    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        return await asyncio.wait_for(self.engine.generate(requests), ENGINE_CALL_TIMEOUT_S)

    async def sleep(self) -> None:
        await asyncio.wait_for(self.engine.sleep(), ENGINE_CALL_TIMEOUT_S)

    async def wake(self) -> None:
        await asyncio.wait_for(self.engine.wake(), ENGINE_CALL_TIMEOUT_S)

    async def update_weights(self, state_dict: Any, version: int) -> None:
        await asyncio.wait_for(
            self.engine.update_weights(state_dict, version), ENGINE_CALL_TIMEOUT_S
        )

    async def weight_version(self) -> int:
        return self.engine.weight_version

    async def state(self) -> str:
        return self.engine.state

    async def stats(self) -> dict[str, Any]:
        return dict(self.engine.stats())

    def _method(self, name: str) -> Any:
        method = getattr(self.engine, name, None)
        if method is None:
            raise NotImplementedError(f"engine {self.name} ({type(self.engine).__name__}): {name}")
        return method

    async def update_weights_from_ipc(self, buckets: list[Any], version: int, done: bool) -> None:
        call = self._method("update_weights_from_ipc")(buckets, version, done)
        await asyncio.wait_for(call, ENGINE_CALL_TIMEOUT_S)

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        call = self._method("init_weight_group")(host, port, rank, world_size, backend)
        await asyncio.wait_for(call, ENGINE_CALL_TIMEOUT_S)

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> None:
        call = self._method("update_weights_from_broadcast")(buckets, version)
        await asyncio.wait_for(call, ENGINE_CALL_TIMEOUT_S)


class RayEngineHandle(EngineHandle):
    """An engine in a genrm-serve ``EngineWorker`` Ray actor (``create_engine_worker``)."""

    def __init__(self, actor: Any, name: str) -> None:
        self.actor = actor
        self.name = name

    async def _call(self, method: str, *args: Any) -> Any:
        ref = getattr(self.actor, method).remote(*args)
        return await asyncio.wait_for(ref, ENGINE_CALL_TIMEOUT_S)

    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        # genrm-serve's EngineWorker micro-batches what it receives; a group goes in one call.
        result: list[EngineOutput] = await self._call("generate_many", requests)
        return result

    async def sleep(self) -> None:
        await self._call("sleep")

    async def wake(self) -> None:
        await self._call("wake")

    async def update_weights(self, state_dict: Any, version: int) -> None:
        # the trainer group hands an object-store reference: one copy, shared by every engine
        await self._call("update_weights", state_dict, version)

    async def weight_version(self) -> int:
        stats: dict[str, Any] = await self._call("stats")
        return int(stats["weight_version"])

    async def state(self) -> str:
        stats: dict[str, Any] = await self._call("stats")
        return str(stats["state"])

    async def stats(self) -> dict[str, Any]:
        return dict(await self._call("stats"))

    async def update_weights_from_ipc(self, buckets: list[Any], version: int, done: bool) -> None:
        await self._call("update_weights_from_ipc", buckets, version, done)

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str
    ) -> None:
        await self._call("init_weight_group", host, port, rank, world_size, backend)

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> None:
        await self._call("update_weights_from_broadcast", buckets, version)
