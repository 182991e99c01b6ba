"""Errors the service answers with, each mapped to one HTTP status and one ``ErrorBody``.

Every non-2xx answer of the service carries ``{"error": {"type", "message", ...}}`` (the shape
OpenAI SDKs also parse), so a client can tell an unknown route_key (never retry) from an
overloaded instance (retry after ``Retry-After``) without reading prose. The status of each
error type comes from genrm-client's ``ERROR_TYPE_STATUS``, the table the client also reads.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from genrm_client.types import ERROR_TYPE_STATUS, SHOULD_RETRY_HEADER, ErrorBody, ErrorDetail
from genrm_serve import limits

__all__ = ["ServiceError", "error_body", "error_response", "status_of"]


def status_of(type_: str) -> int:
    """The HTTP status of an error type: genrm-client's ``ERROR_TYPE_STATUS`` is the one table."""
    try:
        return ERROR_TYPE_STATUS[type_]
    except KeyError:
        raise ValueError(
            f"error type {type_!r} has no status in genrm_client.types.ERROR_TYPE_STATUS"
        ) from None


class ServiceError(Exception):
    """A request the service refuses or cannot complete; carries its HTTP status."""

    def __init__(
        self,
        type_: str,
        message: str,
        *,
        route_key: str | None = None,
        registered_route_keys: list[str] | None = None,
        retry_after_s: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status_of(type_)
        self.type = type_
        self.message = message
        self.route_key = route_key
        self.registered_route_keys = registered_route_keys
        self.retry_after_s = retry_after_s
        #: False: the request already ran on the engines (the router failed it over once), so
        #: the client must not send it again (``x-should-retry: false``); see the README.
        self.retryable = retryable

    def body(self) -> ErrorBody:
        return error_body(
            self.type,
            self.message,
            route_key=self.route_key,
            registered_route_keys=self.registered_route_keys,
        )

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.retryable is False:
            out[SHOULD_RETRY_HEADER] = "false"
        elif self.retry_after_s is not None:
            out["Retry-After"] = str(max(1, round(self.retry_after_s)))
        return out

    @classmethod
    def unknown_route_key(cls, route_key: str, registered: list[str]) -> ServiceError:
        return cls(
            "unknown_route_key",
            f"No GenRM instance registered for route_key={route_key}"
            f" (registered: {', '.join(registered)})",
            route_key=route_key,
            registered_route_keys=registered,
        )

    @classmethod
    def overloaded(
        cls, route_key: str, queued: int, bound: int, retry_after_s: float, share: int | None = None
    ) -> ServiceError:
        """``share``: the bound of the one ingress replica that refused, where it differs."""
        per_replica = f" ({share} per ingress replica)" if share not in (None, bound) else ""
        return cls(
            "overloaded",
            f"route_key={route_key}: {queued} requests already queued, the bound is "
            f"max_queued_requests={bound}{per_replica}; retry later",
            route_key=route_key,
            retry_after_s=retry_after_s,
        )

    @classmethod
    def unavailable(
        cls,
        route_key: str,
        why: str,
        retry_after_s: float = limits.UNAVAILABLE_RETRY_AFTER_S,
        *,
        retryable: bool | None = None,
    ) -> ServiceError:
        return cls(
            "engine_unavailable",
            f"route_key={route_key}: {why}",
            route_key=route_key,
            retry_after_s=retry_after_s,
            retryable=retryable,
        )

    @classmethod
    def asleep(cls, route_key: str) -> ServiceError:
        return cls(
            "instance_asleep",
            f"route_key={route_key}: the instance is asleep (POST /genrm/wake_up first)",
            route_key=route_key,
            retry_after_s=limits.ASLEEP_RETRY_AFTER_S,
        )


def error_body(type_: str, message: str, **fields: Any) -> ErrorBody:
    """An ``ErrorBody`` with the optional fields that are set."""
    return ErrorBody(
        error=ErrorDetail(
            type=type_, message=message, **{k: v for k, v in fields.items() if v is not None}
        )
    )


def error_response(
    type_: str, message: str, *, headers: dict[str, str] | None = None, **fields: Any
) -> JSONResponse:
    """The JSON error answer for ``type_``, with its status from the one table."""
    body = error_body(type_, message, **fields)
    return JSONResponse(
        body.model_dump(exclude_none=True), status_code=status_of(type_), headers=headers
    )
