"""The retry policy as small pure functions, so each rule can be tested without a network.

Retried: transport errors (decided by the client), HTTP 429 and every 5xx. Never retried: any other
4xx — a bad request or an unknown route_key does not get better by asking again — and any answer
marked ``x-should-retry: false`` (the service already retried it on another engine). The delay is
the server's ``Retry-After`` when it sends one (clamped to ``RETRY_AFTER_MAX_S``), else exponential
backoff with jitter so that many coroutines refused at once do not come back in lockstep.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from genrm_client._constants import (
    BACKOFF_INITIAL_S,
    BACKOFF_JITTER_MIN,
    BACKOFF_MAX_S,
    RETRY_AFTER_MAX_S,
)
from genrm_client.types import SHOULD_RETRY_HEADER

__all__ = ["backoff_delay", "parse_retry_after", "retry_delay", "should_retry"]


def should_retry(status: int, headers: Mapping[str, str] | None = None) -> bool:
    """Whether an answer is worth another attempt: 429 and 5xx, unless the server says otherwise.

    The server's ``x-should-retry`` wins when it sends one: ``false`` after the service already
    failed the request over to a second engine, so that only one layer retries a failure.
    """
    if headers is not None:
        lowered = {k.lower(): v for k, v in headers.items()}
        verdict = lowered.get(SHOULD_RETRY_HEADER, "").strip().lower()
        if verdict in ("true", "false"):
            return verdict == "true"
    return status == 429 or 500 <= status <= 599


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asks us to wait, or ``None`` when it says nothing usable.

    Reads ``retry-after-ms`` (milliseconds), then ``retry-after`` as seconds, then as an HTTP
    date. Header names are matched case-insensitively; negative waits become 0.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms) / 1000.0, 0.0)
        except ValueError:
            pass
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


def backoff_delay(attempt: int, *, rng: random.Random | None = None) -> float:
    """Jittered exponential backoff before retry number ``attempt`` (0 for the first retry).

    ``BACKOFF_INITIAL_S * 2**attempt`` capped at ``BACKOFF_MAX_S``, times a factor drawn from
    ``[BACKOFF_JITTER_MIN, 1]``.
    """
    base = min(BACKOFF_INITIAL_S * (2.0 ** max(attempt, 0)), BACKOFF_MAX_S)
    factor = (rng or random).uniform(BACKOFF_JITTER_MIN, 1.0)
    return base * factor


def retry_delay(attempt: int, retry_after: float | None) -> float:
    """The wait before retry ``attempt``: the server's Retry-After (capped) if any, else backoff."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), RETRY_AFTER_MAX_S)
    return backoff_delay(attempt)
