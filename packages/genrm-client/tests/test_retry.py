"""The retry policy's pure functions: what is retried, for how long, and what a server may ask."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest

from genrm_client._constants import BACKOFF_INITIAL_S, BACKOFF_MAX_S, RETRY_AFTER_MAX_S
from genrm_client._retry import backoff_delay, parse_retry_after, retry_delay, should_retry


@pytest.mark.parametrize(
    ("status", "retried"),
    [(200, False), (400, False), (404, False), (408, False), (422, False), (429, True),
     (500, True), (502, True), (503, True), (504, True)],
    ids=lambda v: str(v),
)  # fmt: skip
def test_should_retry(status: int, retried: bool) -> None:
    assert should_retry(status) is retried


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"Retry-After-Ms": "250"}, 0.25),
        ({"retry-after-ms": "oops", "retry-after": "2"}, 2.0),
        ({"retry-after": "-4"}, 0.0),
        ({"retry-after": formatdate(NOW + 7, usegmt=True)}, 7.0),
        ({"retry-after": formatdate(NOW - 7, usegmt=True)}, 0.0),
        ({"retry-after": "tomorrow"}, None),
    ],
    ids=["none", "seconds", "fraction", "ms", "bad-ms-falls-back", "negative", "date",
         "past-date", "garbage"],
)  # fmt: skip
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(0)
    for attempt in range(10):
        nominal = min(BACKOFF_INITIAL_S * 2**attempt, BACKOFF_MAX_S)
        delays = [backoff_delay(attempt, rng=rng) for _ in range(200)]
        assert all(0.75 * nominal <= d <= nominal for d in delays)
        assert len(set(delays)) > 100  # jittered, not lockstep


def test_retry_after_wins_over_backoff_and_is_capped() -> None:
    assert retry_delay(0, 2.0) == 2.0
    assert retry_delay(5, 0.0) == 0.0
    assert retry_delay(0, 10_000.0) == RETRY_AFTER_MAX_S
    assert 0 < retry_delay(0, None) <= BACKOFF_INITIAL_S


@pytest.mark.parametrize(
    ("status", "headers", "retried"),
    [
        pytest.param(503, {"x-should-retry": "false"}, False, id="503-told-not-to"),
        pytest.param(503, {"X-Should-Retry": "False"}, False, id="case-insensitive"),
        pytest.param(503, {"Retry-After": "1"}, True, id="503-plain"),
        pytest.param(409, {"x-should-retry": "true"}, True, id="4xx-told-to"),
        pytest.param(503, {"x-should-retry": "maybe"}, True, id="junk-ignored"),
    ],
)
def test_should_retry_obeys_the_server(status: int, headers: dict[str, str], retried: bool) -> None:
    assert should_retry(status, headers) is retried
