"""Errors raised by the GenRM client.

::

    GenRMError
     ├── GenRMConnectionError      the server could not be reached (after retries)
     ├── GenRMTimeoutError         the call's total deadline passed
     └── GenRMHTTPError            the server answered with a non-2xx status (after retries)
          ├── UnknownRouteKeyError   404: no instance registered for the route_key (never retried)
          └── GenRMOverloadedError   429/503 still refused after every retry

A reward function turns any ``GenRMError`` into a ``judge_error`` result, never into a score of 0.
Bad input given to the client itself (an unknown sampling key, a malformed message) is a
programming error and raises ``ValueError``/``TypeError`` before any network call instead.

Every error pickles with its fields intact, so it survives a trip through Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "GenRMConnectionError",
    "GenRMError",
    "GenRMHTTPError",
    "GenRMOverloadedError",
    "GenRMTimeoutError",
    "UnknownRouteKeyError",
]


class GenRMError(Exception):
    """Root of every error this client raises."""


class GenRMConnectionError(GenRMError):
    """The service could not be reached (connection refused, reset, DNS), after retries."""


class GenRMTimeoutError(GenRMError):
    """The call did not complete within its total deadline."""


class GenRMHTTPError(GenRMError):
    """The service answered with a non-success status."""

    def __init__(
        self, message: str, *, status: int, body: Any = None, request_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.request_id = request_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_http_error,
            (type(self), str(self), self.status, self.body, self.request_id),
        )


class UnknownRouteKeyError(GenRMHTTPError):
    """No judge instance is registered for the route_key (HTTP 404)."""

    def __init__(
        self,
        route_key: str | None,
        registered: list[str] | None = None,
        *,
        body: Any = None,
        request_id: str | None = None,
    ) -> None:
        msg = f"No GenRM instance registered for route_key={route_key}"
        if registered:
            msg += f" (registered: {', '.join(sorted(registered))})"
        super().__init__(msg, status=404, body=body, request_id=request_id)
        self.route_key = route_key
        self.registered = registered

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.route_key, self.registered),
            {"body": self.body, "request_id": self.request_id},
        )


class GenRMOverloadedError(GenRMHTTPError):
    """The service kept refusing for load (429 / 503) after every retry."""


def _rebuild_http_error(
    cls: type[GenRMHTTPError], message: str, status: int, body: Any, request_id: str | None
) -> GenRMHTTPError:
    return cls(message, status=status, body=body, request_id=request_id)
