"""The one interface every judge (and rollout) engine implements.

Engines are wrapped in plain Ray actors (``genrm_serve.engines.worker``), not Serve replicas, so
that rl-core can place them into the placement-group bundles its plan gives them. The ingress
only ever talks to that actor; an engine never sees HTTP.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from genrm_client.types import FinishReason, Message, SamplingParams
from genrm_serve.config import InstanceSpec

__all__ = [
    "Engine",
    "EngineAsleepError",
    "EngineBatchError",
    "EngineError",
    "EngineOutput",
    "EngineRequest",
    "EngineState",
    "EngineTimeoutError",
    "PromptTooLongError",
    "RequestRefusedError",
    "engine_id_for",
]

EngineState = Literal["created", "loading", "awake", "asleep", "failed", "stopped"]


def engine_id_for(route_key: str, engine_index: int) -> str:
    """The id engine ``engine_index`` of instance ``route_key`` reports: ``<route_key>/<index>``
    (the service's slots name it the same way)."""
    return f"{route_key}/{engine_index}"


class EngineError(RuntimeError):
    """The engine could not serve a request (a retry on another engine may succeed)."""


class EngineFailedError(EngineError):
    """The engine marked itself failed (its wake check found weights that did not survive a
    sleep): it must not serve again, but be re-created from the model on disk by its owner."""


class EngineAsleepError(EngineError):
    """The engine has released its memory (``sleep()``) and must be woken first."""


class EngineBatchError(EngineError):
    """Some requests of a batch failed on their own; ``results`` has, per request in order, its
    output or its own error. The worker settles each request with its entry, so one bad request
    (an over-long prompt, a value the engine refuses) never fails its neighbours.
    """

    def __init__(self, results: list[EngineOutput | BaseException]) -> None:
        failed = [r for r in results if isinstance(r, BaseException)]
        super().__init__(
            f"{len(failed)} of {len(results)} requests failed"
            + (f"; first: {failed[0]}" if failed else "")
        )
        self.results = results


class EngineTimeoutError(EngineError):
    """A request ran out of its time waiting in an engine actor (queue included)."""


class RequestRefusedError(EngineError):
    """This request, by itself, is one the engine refuses (a value it cannot honour): it fails
    alone, before any compute, while its batch neighbours run; no other engine is tried, as every
    engine would refuse it too (HTTP 422 unless a subclass says otherwise).
    """


class VerdictUnavailableError(RequestRefusedError):
    """A logprob verdict was asked for where it means nothing (thinking on, "1"/"0" not tokens)."""


class PromptTooLongError(RequestRefusedError):
    """The prompt is longer than ``max_context_len``: refused before any compute (HTTP 413)."""

    def __init__(self, prompt_tokens: int, max_context_len: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens, more than max_context_len={max_context_len}"
        )
        self.prompt_tokens = prompt_tokens
        self.max_context_len = max_context_len

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray pickles an actor's exception to its caller; the default reduce would call
        # ``__init__(message)`` and fail, turning a 413 into an opaque error.
        return (type(self), (self.prompt_tokens, self.max_context_len))


@dataclass
class EngineRequest:
    """One generation. ``sampling`` is already merged over the instance's defaults.

    Either ``messages`` (chat; the engine applies the chat template with
    ``sampling.chat_template_kwargs``) or ``prompt_token_ids`` (rollout with pre-tokenised
    prompts) is given.
    """

    sampling: SamplingParams
    messages: list[Message] | None = None
    prompt_token_ids: list[int] | None = None
    #: Rollout needs the sampled tokens and their log-probs (for TIS); a judge does not.
    return_tokens: bool = False
    request_id: str | None = None
    #: Affinity key (``GenerateRequest.prefix_key``): the router sends requests with the same
    #: key to the same engine, so their shared prompt prefix stays in its cache. Engines ignore it.
    prefix_key: str | None = None
    #: Seconds this request has left when sent (the router's deadline, less what it waited
    #: there): the engine actor's queue wait takes it instead of its own full request deadline.
    timeout_s: float | None = None


@dataclass
class EngineOutput:
    """What came out of one request."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    #: With ``return_tokens``: every sampled token (EOS and stop-string tokens included).
    token_ids: list[int] | None = None
    #: Per token: log-prob under the distribution it was sampled from (temperature-scaled,
    #: before top-k/top-p truncation; the raw model's at temperature 0). Engine-specific: see it.
    logprobs: list[float] | None = None
    latency_s: float = 0.0
    weight_version: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: Per token: log-prob under the raw model (``log_softmax(logits)``, temperature 1), when the
    #: engine can give it cheaply (the hf engine does).
    raw_logprobs: list[float] | None = None


class Engine(abc.ABC):
    """A model that turns batches of requests into outputs, and can free / restore its memory.

    The whole engine API: lifecycle (``start``, ``sleep``, ``wake``, ``shutdown``), requests
    (``generate``), health and counters, and the weight transports of a rollout engine
    (``update_weights`` through the object store; ``update_weights_from_ipc`` and the broadcast
    pair on GPUs). An engine without a transport keeps its default, which refuses.
    """

    #: The engine schedules requests itself (continuous batching: SGLang): its worker hands it
    #: every batch as it forms, without waiting for the one before to finish. An engine that
    #: computes one batch at a time (hf) leaves False.
    continuous_batching: ClassVar[bool] = False

    def __init__(self, spec: InstanceSpec, engine_id: str) -> None:
        self.spec = spec
        self.engine_id = engine_id
        self.state: EngineState = "created"
        self.weight_version = 0

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; after it, ``state == "awake"``."""

    @abc.abstractmethod
    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        """Generate for a batch; one output per request, in order.

        Raises :class:`PromptTooLongError` for an over-long prompt before any compute, and
        :class:`EngineAsleepError` while asleep.
        """

    @abc.abstractmethod
    async def sleep(self) -> None:
        """Free accelerator memory (weights and KV cache); idempotent."""

    @abc.abstractmethod
    async def wake(self) -> None:
        """Restore what ``sleep()`` freed; idempotent."""

    async def check_health(self) -> None:
        """Raise if the engine cannot serve; the default trusts ``state``."""
        if self.state == "failed":
            raise EngineError(f"engine {self.engine_id} failed")

    def mark_failed(self, why: str) -> None:
        """The engine can no longer be trusted to serve (e.g. its wake check failed): its health
        check fails from now on, so that its supervisor re-creates it."""
        self.state = "failed"

    def stats(self) -> dict[str, Any]:
        """Counters for metrics and debugging (JSON-serialisable)."""
        return {
            "engine_id": self.engine_id,
            "route_key": self.spec.route_key,
            "state": self.state,
            "weight_version": self.weight_version,
            "weight_group_ranks": self.weight_group_ranks,
        }

    @property
    def weight_group_ranks(self) -> int:
        """How many ranks this engine takes in the weight-broadcast group: one per process that
        receives the broadcast (an SGLang engine joins from each TP rank). The trainer reads it
        from ``stats()`` to give each engine its first rank and to size the group."""
        return 1

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Load new policy weights (rollout engines); ``version`` must increase."""
        raise NotImplementedError(f"{type(self).__name__} does not accept weight updates")

    def _no_transport(self, name: str) -> EngineError:
        return EngineError(
            f"engine {self.engine_id} ({type(self).__name__}) has no {name}: "
            "use the object-store path (update_weights)"
        )

    async def update_weights_from_ipc(
        self, buckets: list[tuple[Any, Any]], version: int, done: bool = True
    ) -> None:
        """Flat weight buckets shared through CUDA IPC by a trainer on this GPU (a sync may come
        in several calls; the weight version moves to ``version`` with the one marked ``done``)."""
        raise self._no_transport("update_weights_from_ipc")

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str = "nccl"
    ) -> None:
        """Join the weight-broadcast group of trainer rank 0 (rank 0) and the engines."""
        raise self._no_transport("init_weight_group")

    async def update_weights_from_broadcast(self, buckets: list[Any], version: int) -> None:
        """Receive every bucket of a sync from the weight group, then serve ``version``."""
        raise self._no_transport("update_weights_from_broadcast")

    async def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release everything; the default does nothing."""
