"""Every tunable of the client in one place, so a default is changed once and documented once.

The values suit an RL rollout that calls one judge service from many coroutines: a generous total
deadline per call (a judge behind a busy queue is slow, never silent), a few retries with
jittered exponential backoff, and a connection pool large enough for a rollout batch.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "BACKOFF_INITIAL_S",
    "BACKOFF_JITTER_MIN",
    "BACKOFF_MAX_S",
    "DEFAULT_BASE_URL",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_TIMEOUT_S",
    "KEEPALIVE_EXPIRY_S",
    "OVERLOAD_STATUSES",
    "REQUEST_ID_HEADER",
    "RETRY_AFTER_MAX_S",
]

#: Where the service listens by default (Ray Serve's port, the ``/genrm`` route prefix).
DEFAULT_BASE_URL: Final = "http://127.0.0.1:8000/genrm"

#: Total deadline of one call, retries and backoff sleeps included. Below genrm-serve's request
#: deadline (``REQUEST_TIMEOUT_S``, 600 s) on purpose: this is the caller's patience (an RL step
#: takes a judge silent for two minutes as a ``judge_error`` and goes on), the service's is the
#: backstop for every caller. Only the order matters: past the service's deadline a call gets a
#: 504, which the client would retry. README, "Why 120 s and not the service's 600 s".
DEFAULT_TIMEOUT_S: Final = 120.0

#: The connect phase of one attempt (bounded by what is left of the total deadline).
DEFAULT_CONNECT_TIMEOUT_S: Final = 10.0

#: Retries after the first attempt (so ``DEFAULT_MAX_RETRIES + 1`` attempts at most).
DEFAULT_MAX_RETRIES: Final = 3

#: Size of the connection pool: the most requests in flight to the service at once.
DEFAULT_MAX_CONNECTIONS: Final = 256

#: How long an idle pooled connection is kept.
KEEPALIVE_EXPIRY_S: Final = 30.0

#: Default concurrency of ``generate_many``.
DEFAULT_CONCURRENCY: Final = 64

#: Exponential backoff: first delay, cap, and the jitter factor's lower bound (factor in [min, 1]).
BACKOFF_INITIAL_S: Final = 0.5
BACKOFF_MAX_S: Final = 8.0
BACKOFF_JITTER_MIN: Final = 0.75

#: A server's Retry-After is honoured up to this many seconds (longer values are clamped).
RETRY_AFTER_MAX_S: Final = 30.0

#: Statuses that mean "too busy, come back later"; after the last retry they raise
#: ``GenRMOverloadedError`` instead of the generic ``GenRMHTTPError``.
OVERLOAD_STATUSES: Final = frozenset({429, 503})

#: One id per call, sent on every attempt, so server logs can join retries of the same call.
REQUEST_ID_HEADER: Final = "X-Request-ID"
