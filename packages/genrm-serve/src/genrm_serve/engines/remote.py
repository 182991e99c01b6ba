"""The caller's side of one engine actor: every call, its deadline, cancellation and death.

An engine runs in an :class:`~genrm_serve.engines.worker.EngineWorker` Ray actor; a
:class:`RemoteEngine` is that engine as seen from outside the actor (like Ray Serve's
``ActorReplicaWrapper``, the name says which side of the actor it is on; ``genrm_serve`` keeps
its old name, ``EngineActor``, as an alias). Everyone who talks to an engine actor (the router,
the supervisor, rl-core's rollout, weight sync, phases, layout report and memory probe) does it
through a :class:`RemoteEngine`, so the answers to "what happens when an engine dies mid-call?"
and "what is the deadline of this call?" are in this file:

- **Deadline.** Every call has one: the ``timeout_s`` given to the call, else the one given to
  the :class:`RemoteEngine` (rl-core: one number for every call), else genrm-serve's
  ``limits`` for that kind of call. Past it, :class:`TimeoutError`.
- **Cancellation.** A request (``generate_many``) whose caller went away or ran out of time is
  cancelled on the actor (``ray.cancel``), which frees the engine's batch slot for someone else.
  A control call (start, sleep, wake, a weight update) is not: cancelling it would leave the
  engine half-way through loading or freeing memory.
- **Death.** Ray's ``RayActorError`` (``ActorDiedError`` included) and ``ActorUnavailableError``
  become one :class:`EngineGoneError`, raised ``from`` Ray's error (kept as ``cause``). Errors the
  engine raised itself (``EngineAsleepError``, ``RequestRefusedError``, ...) pass unchanged.

``worker.py`` must not import this module (the factory, ``create_engine_worker``, stays there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal, overload

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from genrm_serve import limits
from genrm_serve.engines.base import EngineError, EngineOutput, EngineRequest

__all__ = ["ACTOR_GONE", "EngineGoneError", "RemoteEngine"]

logger = logging.getLogger(__name__)


#: Ray's errors for an actor that died (``ActorDiedError`` is a ``RayActorError``) or that cannot
#: be reached now: the only place they are named.
ACTOR_GONE: tuple[type[BaseException], ...] = (RayActorError, ActorUnavailableError)


class EngineGoneError(EngineError):
    """The engine's actor died or cannot be reached; ``cause`` is Ray's error."""

    def __init__(self, engine_id: str, cause: BaseException) -> None:
        super().__init__(f"engine {engine_id}: actor gone: {cause}")
        self.engine_id = engine_id
        #: Ray's error (what ``router.error_message`` reports)
        self.cause = cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.engine_id, self.cause))


def _cancel(ref: Any) -> None:
    if ref is None:
        return
    try:
        ray.cancel(ref)
    except Exception:  # already finished, or the actor is gone
        logger.debug("could not cancel an engine call", exc_info=True)


class RemoteEngine:
    """One engine actor as its callers see it (see the module docstring for the rules)."""

    def __init__(self, handle: Any, engine_id: str, *, timeout_s: float | None = None) -> None:
        """``handle``: the Ray actor handle (``create_engine_worker``); ``engine_id``: the name
        in errors; ``timeout_s``: the deadline of every call not given its own."""
        self.handle = handle
        self.engine_id = engine_id
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return self.engine_id

    def __repr__(self) -> str:
        return f"RemoteEngine({self.engine_id!r})"

    # ---- the one call ----------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        *args: Any,
        timeout_s: float | None,
        default_s: float,
        cancel: bool = False,
        **kwargs: Any,
    ) -> Any:
        deadline = timeout_s if timeout_s is not None else (self.timeout_s or default_s)
        ref: Any = None
        try:
            ref = getattr(self.handle, method).remote(*args, **kwargs)
            return await asyncio.wait_for(ref, deadline)
        except (asyncio.CancelledError, TimeoutError):
            if cancel:
                _cancel(ref)  # free the engine's slot for someone else
            raise
        except ACTOR_GONE as err:
            raise EngineGoneError(self.engine_id, err) from err

    # ---- lifecycle and health ----------------------------------------------------------------

    async def start(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Load the model (idempotent); the engine's :meth:`info`. Its own deadline: a start is
        not bound by the actor's ``timeout_s`` unless given here."""
        deadline = timeout_s if timeout_s is not None else limits.ENGINE_START_TIMEOUT_S
        info: dict[str, Any] = await self._call("start", timeout_s=deadline, default_s=deadline)
        return info

    async def sleep(self, *, timeout_s: float | None = None) -> None:
        await self._call("sleep", timeout_s=timeout_s, default_s=limits.SLEEP_TIMEOUT_S)

    async def wake(self, *, timeout_s: float | None = None) -> None:
        await self._call("wake", timeout_s=timeout_s, default_s=limits.SLEEP_TIMEOUT_S)

    async def shutdown(self, *, timeout_s: float | None = None) -> None:
        """End the engine in order (queued requests failed, model released, what it keeps on
        disk removed), its actor left to whoever owns its bundle; an actor already gone has
        nothing to end."""
        with contextlib.suppress(EngineGoneError):
            await self._call(
                "shutdown", timeout_s=timeout_s, default_s=limits.ENGINE_SHUTDOWN_TIMEOUT_S
            )

    async def kill(self) -> None:
        """End the actor for good (no restart by Ray): one that marked itself failed still
        holds its bundle's resources, which its replacement needs."""
        with contextlib.suppress(*ACTOR_GONE):  # already gone: nothing holds the bundle
            await asyncio.to_thread(ray.kill, self.handle, no_restart=True)  # a GCS call

    async def check_health(self, *, timeout_s: float | None = None) -> bool:
        """Raise if the engine cannot serve; else whether it is asleep."""
        asleep = await self._call(
            "check_health", timeout_s=timeout_s, default_s=limits.PROBE_TIMEOUT_S
        )
        return bool(asleep)

    async def stats(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Counters, state, weight version and (on CUDA) GPU memory."""
        return dict(
            await self._call("stats", timeout_s=timeout_s, default_s=limits.PROBE_TIMEOUT_S)
        )

    async def info(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Who and where the engine is (node, GPUs, placement group)."""
        return dict(await self._call("info", timeout_s=timeout_s, default_s=limits.PROBE_TIMEOUT_S))

    async def weight_version(self, *, timeout_s: float | None = None) -> int:
        return int((await self.stats(timeout_s=timeout_s))["weight_version"])

    async def state(self, *, timeout_s: float | None = None) -> str:
        return str((await self.stats(timeout_s=timeout_s))["state"])

    # ---- requests ----------------------------------------------------------------------------

    async def generate(
        self, request: EngineRequest, *, timeout_s: float | None = None
    ) -> EngineOutput:
        """One request (batched with others in the actor); its failure is raised."""
        out: EngineOutput = await self._call(
            "generate",
            request,
            timeout_s=timeout_s,
            default_s=limits.REQUEST_TIMEOUT_S,
            cancel=True,
        )
        return out

    @overload
    async def generate_many(
        self,
        requests: list[EngineRequest],
        *,
        return_exceptions: Literal[False] = False,
        timeout_s: float | None = None,
    ) -> list[EngineOutput]: ...
    @overload
    async def generate_many(
        self,
        requests: list[EngineRequest],
        *,
        return_exceptions: Literal[True],
        timeout_s: float | None = None,
    ) -> list[EngineOutput | BaseException]: ...
    async def generate_many(
        self,
        requests: list[EngineRequest],
        *,
        return_exceptions: bool = False,
        timeout_s: float | None = None,
    ) -> list[EngineOutput] | list[EngineOutput | BaseException]:
        """Requests in one engine batch (unless more than ``max_batch_size``), in order; the
        first failure raised, or with ``return_exceptions`` each failed request's own error."""
        kwargs = {"return_exceptions": True} if return_exceptions else {}
        result: list[Any] = await self._call(
            "generate_many",
            requests,
            timeout_s=timeout_s,
            default_s=limits.REQUEST_TIMEOUT_S,
            cancel=True,
            **kwargs,
        )
        return result

    # ---- weights -----------------------------------------------------------------------------

    async def update_weights(
        self, state_dict: Any, version: int, *, timeout_s: float | None = None
    ) -> int:
        """New weights (a state dict, or an object-store reference to one); the new version."""
        return int(
            await self._call(
                "update_weights",
                state_dict,
                version,
                timeout_s=timeout_s,
                default_s=limits.WEIGHT_UPDATE_TIMEOUT_S,
            )
        )

    async def update_weights_from_ipc(
        self, buckets: list[Any], version: int, done: bool, *, timeout_s: float | None = None
    ) -> int:
        """Flat buckets shared through CUDA IPC by the trainer rank on this engine's GPU."""
        return int(
            await self._call(
                "update_weights_from_ipc",
                buckets,
                version,
                done,
                timeout_s=timeout_s,
                default_s=limits.WEIGHT_UPDATE_TIMEOUT_S,
            )
        )

    async def init_weight_group(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        backend: str,
        *,
        timeout_s: float | None = None,
    ) -> None:
        """Join the weight-broadcast group of trainer rank 0 and the engines."""
        await self._call(
            "init_weight_group",
            host,
            port,
            rank,
            world_size,
            backend,
            timeout_s=timeout_s,
            default_s=limits.WEIGHT_UPDATE_TIMEOUT_S,
        )

    async def update_weights_from_broadcast(
        self, buckets: list[Any], version: int, *, timeout_s: float | None = None
    ) -> int:
        """Receive a sync's buckets from the weight group; the new version."""
        return int(
            await self._call(
                "update_weights_from_broadcast",
                buckets,
                version,
                timeout_s=timeout_s,
                default_s=limits.WEIGHT_UPDATE_TIMEOUT_S,
            )
        )
