"""Wire schema of the GenRM service: the single source of truth shared by client and server.

Models reject unknown keys (``extra="forbid"``) so that a typo in a sampling parameter is an
error naming the key, never a silently ignored setting.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_ROUTE_KEY",
    "ERROR_TYPE_STATUS",
    "SHOULD_RETRY_HEADER",
    "ErrorBody",
    "ErrorDetail",
    "FinishReason",
    "GenerateBatchRequest",
    "GenerateBatchResponse",
    "GenerateMeta",
    "GenerateRequest",
    "GenerateResponse",
    "HealthReport",
    "InstanceHealth",
    "Message",
    "SamplingParams",
]

#: The route_key of the legacy single judge (``--genrm-model-path``) and of requests without one.
DEFAULT_ROUTE_KEY = "__default__"

#: ``ErrorDetail.type`` values the client understands, with the HTTP status the service answers
#: them with (a per-item error inside ``generate_batch`` carries no status of its own; the client
#: takes it from here). ``unknown_route_key`` → ``UnknownRouteKeyError``, ``overloaded`` →
#: ``GenRMOverloadedError``, ``timeout`` → ``GenRMTimeoutError``; any other type (or one not listed)
#: → ``GenRMHTTPError`` with this status (500 when not listed).
ERROR_TYPE_STATUS: dict[str, int] = {
    "invalid_request": 422,
    "unauthorized": 401,
    "forbidden": 403,
    "unknown_route_key": 404,
    "not_found": 404,
    "method_not_allowed": 405,
    "prompt_too_long": 413,
    "request_too_large": 413,
    "overloaded": 429,
    "engine_unavailable": 503,
    "instance_asleep": 503,
    "unhealthy": 503,
    "sleep_failed": 503,
    "wake_failed": 503,
    "timeout": 504,
    "engine_error": 500,
    "internal": 500,
}

#: The service's verdict on retrying a failed answer (``true`` / ``false``); it wins over the
#: status. ``false``: the request already ran on two engines (the service's failover), so a
#: client retry would only add load.
SHOULD_RETRY_HEADER = "x-should-retry"

FinishReason = Literal["stop", "length", "abort", "error"]


class _Strict(BaseModel):
    """What a client sends: an unknown key is a mistake to report, not to drop."""

    model_config = ConfigDict(extra="forbid")


class _Reply(BaseModel):
    """What the server sends: ignore fields a newer server adds, so old clients keep working."""

    model_config = ConfigDict(extra="ignore")


class Message(_Strict):
    """One chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class SamplingParams(_Strict):
    """Per-request sampling overrides; every field left ``None`` inherits the instance's config."""

    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    max_response_len: int | None = Field(default=None, gt=0)
    stop: list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    seed: int | None = None
    #: Also return ``P("1") / (P("1") + P("0"))`` at the first reply position as
    #: ``meta.verdict_prob`` (engines that support it: hf). Needs thinking off and "1" / "0"
    #: single tokens of the judge's tokenizer; refused otherwise.
    logprob_verdict: bool | None = None

    def merged_over(self, base: SamplingParams) -> SamplingParams:
        """Return ``base`` with every field this object sets taken from this object."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


class GenerateRequest(_Strict):
    """Body of ``POST /genrm/generate``."""

    messages: list[Message] = Field(min_length=1)
    sampling_params: SamplingParams | None = None
    route_key: str | None = None
    #: Affinity key: requests with the same key go to the same engine of the instance while it
    #: is healthy and not clearly busier than the others, so a prompt prefix they share (a GRPO
    #: group's question and reference) stays in that engine's prefix cache. Any stable string
    #: (e.g. a hash of the shared part); ``None``: routed by load alone. Never sent when unset.
    prefix_key: str | None = Field(default=None, min_length=1, max_length=256)


class GenerateMeta(_Reply):
    """What the engine reports beside the text."""

    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    route_key: str | None = None
    engine_id: str | None = None
    engine_latency_s: float | None = None
    #: With ``sampling_params.logprob_verdict``: ``P("1") / (P("1") + P("0"))`` at the first
    #: reply position, from the same forward pass as the reply.
    verdict_prob: float | None = None
    #: Prompt tokens this request did not compute alone: SGLang's radix-cache hits, the hf
    #: engine's tokens shared with other requests of its batch. None: the engine does not say.
    cached_prompt_tokens: int | None = None


class GenerateResponse(_Reply):
    """Body of a successful ``POST /genrm/generate``."""

    response: str
    meta: GenerateMeta | None = None


class GenerateBatchRequest(_Strict):
    """Body of ``POST /genrm/generate_batch``: independent requests answered in order."""

    requests: list[GenerateRequest] = Field(min_length=1)


class ErrorDetail(_Reply):
    """What went wrong, for a machine and a person."""

    type: str
    message: str
    route_key: str | None = None
    registered_route_keys: list[str] | None = None


class ErrorBody(_Reply):
    """Body of every non-2xx answer of the service: ``{"error": {...}}``."""

    error: ErrorDetail


class GenerateBatchResponse(_Reply):
    """One entry per request, in order: a response, or the error of that request alone."""

    results: list[GenerateResponse | ErrorBody]


class InstanceHealth(_Reply):
    """Health of one judge instance (route_key)."""

    status: Literal["healthy", "degraded", "unhealthy", "asleep"]
    engines_total: int | None = None
    engines_healthy: int | None = None
    #: Engines whose start failed again after a re-creation: the service will not bring them
    #: back (a waiter should stop waiting and show ``detail``).
    engines_failed: int | None = None
    detail: str | None = None


class HealthReport(BaseModel):
    """Body of ``GET /genrm/health``.

    Exactly ``{"status": "healthy", "service": "genrm"}`` with one instance; ``instances`` is
    present with several (or when unhealthy, to say which).
    """

    model_config = ConfigDict(extra="allow")

    status: Literal["healthy", "unhealthy"]
    service: Literal["genrm"] = "genrm"
    instances: dict[str, InstanceHealth] | None = None
