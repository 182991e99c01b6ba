"""Errors the service answers with, each mapped to one HTTP status and one ``ErrorBody``.

Every non-2xx answer of the service carries ``{"error": {"type", "message", ...}}`` (the shape
OpenAI SDKs also parse), so a client can tell an unknown route_key (never retry) from an
overloaded instance (retry after ``Retry-After``) without reading prose.
"""

from __future__ import annotations

from typing import Any

from genrm_client.types import ErrorBody, ErrorDetail

__all__ = ["ServiceError", "error_body"]


class ServiceError(Exception):
    """A request the service refuses or cannot complete; carries its HTTP status."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        route_key: str | None = None,
        registered_route_keys: list[str] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.route_key = route_key
        self.registered_route_keys = registered_route_keys
        self.retry_after_s = retry_after_s

    def body(self) -> ErrorBody:
        return error_body(
            self.type,
            self.message,
            route_key=self.route_key,
            registered_route_keys=self.registered_route_keys,
        )

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}

    @classmethod
    def unknown_route_key(cls, route_key: str, registered: list[str]) -> ServiceError:
        return cls(
            404,
            "unknown_route_key",
            f"No GenRM instance registered for route_key={route_key}"
            f" (registered: {', '.join(registered)})",
            route_key=route_key,
            registered_route_keys=registered,
        )

    @classmethod
    def overloaded(
        cls, route_key: str, queued: int, bound: int, retry_after_s: float
    ) -> ServiceError:
        return cls(
            429,
            "overloaded",
            f"route_key={route_key}: {queued} requests already queued, the bound is "
            f"max_queued_requests={bound}; retry later",
            route_key=route_key,
            retry_after_s=retry_after_s,
        )

    @classmethod
    def unavailable(cls, route_key: str, why: str, retry_after_s: float = 1.0) -> ServiceError:
        return cls(
            503,
            "engine_unavailable",
            f"route_key={route_key}: {why}",
            route_key=route_key,
            retry_after_s=retry_after_s,
        )

    @classmethod
    def asleep(cls, route_key: str) -> ServiceError:
        return cls(
            503,
            "instance_asleep",
            f"route_key={route_key}: the instance is asleep (POST /genrm/wake_up first)",
            route_key=route_key,
            retry_after_s=5.0,
        )


def error_body(type_: str, message: str, **fields: Any) -> ErrorBody:
    """An ``ErrorBody`` with the optional fields that are set."""
    return ErrorBody(
        error=ErrorDetail(
            type=type_, message=message, **{k: v for k, v in fields.items() if v is not None}
        )
    )
