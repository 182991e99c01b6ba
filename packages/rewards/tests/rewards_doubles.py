"""Test helpers of genrm-rewards: a plain sample type and a *test double* of the GenRM client.

``JudgeDouble`` is not the client: it is a hand-written object with the client's ``generate`` /
``generate_batch`` methods that answers from a script, records every call, and raises the
client's real exception types, so unit tests of reward functions need no network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from genrm_client import GenRMError
from genrm_client.types import GenerateRequest, GenerateResponse


@dataclass
class Sample:
    """A minimal object satisfying ``SampleLike``."""

    response: str
    label: Any = None
    prompt: Any = "What is 6 * 7?"
    metadata: Mapping[str, Any] = field(default_factory=dict)


class Args:
    """An attribute bag like the trainer's config (only what a test sets)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


Reply = str | GenRMError
Script = Callable[[list[dict[str, str]], str | None], Reply]


class JudgeDouble:
    """Test double of ``AsyncGenRMClient``: answers by ``script(messages, route_key)``."""

    def __init__(self, script: Script | Reply = "1", *, delay_s: float = 0.0) -> None:
        self._script = script
        self.delay_s = delay_s
        self.calls: list[tuple[list[dict[str, str]], str | None, dict[str, Any] | None]] = []
        self.prefix_keys: list[str | None] = []  # each call's affinity key, in call order
        self.batch_calls = 0
        self.in_flight = 0
        self.max_in_flight = 0  # the most calls this double was answering at the same time

    async def _wait(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1

    def _answer(self, messages: list[dict[str, str]], route_key: str | None) -> Reply:
        script = self._script
        return script(messages, route_key) if callable(script) else script

    async def generate(
        self,
        messages: list[dict[str, str]],
        sampling_params: dict[str, Any] | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
    ) -> str:
        self.calls.append((messages, route_key, sampling_params))
        self.prefix_keys.append(prefix_key)
        await self._wait()
        reply = self._answer(messages, route_key)
        if isinstance(reply, GenRMError):
            raise reply
        return reply

    async def generate_batch(
        self, requests: list[GenerateRequest]
    ) -> list[GenerateResponse | GenRMError]:
        self.batch_calls += 1
        await self._wait()
        out: list[GenerateResponse | GenRMError] = []
        for req in requests:
            messages = [m.model_dump() for m in req.messages]
            params = (
                req.sampling_params.model_dump(exclude_none=True) if req.sampling_params else None
            )
            self.calls.append((messages, req.route_key, params))
            self.prefix_keys.append(req.prefix_key)
            reply = self._answer(messages, req.route_key)
            out.append(reply if isinstance(reply, GenRMError) else GenerateResponse(response=reply))
        return out


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The user content of a judge prompt."""
    return messages[-1]["content"]


def answer_block(messages: list[dict[str, str]]) -> str:
    """The quoted model-answer block of a dapo-genrm prompt."""
    text = prompt_text(messages)
    start = text.index("<<<BEGIN MODEL ANSWER>>>")
    end = text.index("<<<END MODEL ANSWER>>>") + len("<<<END MODEL ANSWER>>>")
    return text[start:end]


def _quoted(text: str, tag: str) -> str:
    start = text.index(f"<<<BEGIN {tag}>>>\n") + len(f"<<<BEGIN {tag}>>>\n")
    end = text.index(f"\n<<<END {tag}>>>")
    return "\n".join(line.removeprefix("| ") for line in text[start:end].split("\n"))


def pairwise_responses(messages: list[dict[str, str]]) -> tuple[str, str]:
    """Responses A and B of a pairwise-genrm comparison prompt, unquoted."""
    text = prompt_text(messages)
    return _quoted(text, "RESPONSE A"), _quoted(text, "RESPONSE B")


def preferring(
    quality: Callable[[str], float],
    *,
    first_bias: float = 0.0,
    fail_when: str | None = None,
) -> Script:
    """A pairwise judge with known preferences: "1" (A better) when ``quality(A) + first_bias``
    is at least ``quality(B)``, else "0". ``first_bias`` > 0 is a judge that favours whatever it
    reads first; ``fail_when``: a comparison quoting that text fails (as a timed-out call)."""

    def script(messages: list[dict[str, str]], route_key: str | None) -> Reply:
        a, b = pairwise_responses(messages)
        if fail_when is not None and (fail_when in a or fail_when in b):
            from genrm_client import GenRMTimeoutError

            return GenRMTimeoutError(f"judge timed out on a comparison quoting {fail_when!r}")
        return "1" if quality(a) + first_bias >= quality(b) else "0"

    return script
