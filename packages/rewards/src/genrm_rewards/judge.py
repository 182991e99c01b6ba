"""One place where reward functions talk to a judge and turn every outcome into a verdict.

Only ``GenRMError`` (what the client raises after its own retries: connection, timeout,
overload, 4xx/5xx) becomes a failed outcome; a programming error still raises. A failed outcome
becomes a ``"judge_error"`` result with score ``None`` — never 0 (see ``types``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from genrm_client import GenRMError, get_genrm_client
from genrm_client.types import GenerateRequest, GenerateResponse, Message, SamplingParams
from genrm_rewards.args import RewardArgs
from genrm_rewards.records import JudgeRecord, make_record
from genrm_rewards.types import JudgeClient, RewardResult, judge_error_result
from genrm_rewards.verdict import Verdict, parse_verdict

__all__ = [
    "JudgeCall",
    "JudgeOutcome",
    "Judging",
    "default_client",
    "judge_many",
    "judge_one",
    "prefix_key",
]


def prefix_key(*parts: str) -> str:
    """An affinity key for judge prompts that begin with the same text: a hash of ``parts``
    (the prompt's name and what it puts before the judged response, e.g. question and
    reference). A GRPO group's samples share them, so the group's judge requests get one key
    and the service sends them to one engine, whose prefix cache then holds the shared part
    however spread in time the samples finish."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=12)
    return digest.hexdigest()


@dataclass(frozen=True)
class JudgeCall:
    """One judge request: the chat messages and the instance (``None`` → ``"__default__"``);
    ``prefix_key``: requests with the same key go to the same engine (see ``prefix_key()``)."""

    messages: list[dict[str, str]]
    route_key: str | None = None
    prefix_key: str | None = None


@dataclass(frozen=True)
class JudgeOutcome:
    """What came back: a parsed verdict, or the error of a failed call (exactly one is set)."""

    verdict: Verdict | None
    error: str | None
    route_key: str | None
    #: the call's record (``records``): engine, tokens, latency, raw reply, parsed verdict
    record: JudgeRecord | None = None

    @property
    def failed(self) -> bool:
        """The call failed after the client's retries (no verdict)."""
        return self.verdict is None

    def reused(self) -> JudgeOutcome:
        """This outcome handed to another sample by the verdict cache: its record says that no
        new call was made."""
        if self.record is None:
            return self
        return replace(self, record={**self.record, "cache": "hit"})

    def to_result(self) -> RewardResult:
        """The reward dict: ``{"score", "acc", "pred", "status", ...}``."""
        if self.verdict is None:
            failed: RewardResult = {
                "score": None,
                "acc": None,
                "pred": None,
                "status": "judge_error",
                "route_key": self.route_key,
                "error": self.error or "judge call failed",
            }
            if self.record is not None:
                failed["judge_calls"] = [self.record]
            return failed
        result: RewardResult = {
            "score": self.verdict.score,
            "acc": int(self.verdict.score >= 0.5),
            "pred": self.verdict.pred,
            "status": self.verdict.status,
            "route_key": self.route_key,
        }
        if self.verdict.reason is not None:
            result["details"] = {"unparsed_reason": self.verdict.reason}
        if self.record is not None:
            result["judge_calls"] = [self.record]
        return result


#: How a reply becomes a score (``RewardArgs.genrm_verdict``).
VerdictMode = Literal["strict", "logprob"]


def _with_verdict(outcome: JudgeOutcome) -> JudgeOutcome:
    """The outcome with its verdict (or failure) written into its record too."""
    if outcome.record is None:
        return outcome
    record: JudgeRecord = {**outcome.record}
    if outcome.verdict is not None:
        record["verdict"] = outcome.verdict.pred
        record["score"] = outcome.verdict.score
        record["status"] = outcome.verdict.status
    else:
        record["verdict"] = record["score"] = None
        record["status"] = "judge_error"
        record["error"] = outcome.error or "judge call failed"
    return replace(outcome, record=record)


def _outcome(
    reply: GenerateResponse,
    route_key: str | None,
    lenient: bool,
    verdict: VerdictMode,
    latency_s: float,
) -> JudgeOutcome:
    record = make_record(route_key, latency_s, reply=reply.response, meta=reply.meta)
    parsed = parse_verdict(reply.response, lenient=lenient)
    if verdict == "strict":
        return _with_verdict(JudgeOutcome(parsed, None, route_key, record))
    prob = reply.meta.verdict_prob if reply.meta is not None else None
    if prob is None:  # never a silent 0: this judge cannot give the soft score
        error = (
            "genrm_verdict='logprob' but the judge's reply has no meta.verdict_prob (its engine "
            "does not compute logprob verdicts; the hf engine does)"
        )
        return _with_verdict(JudgeOutcome(None, error, route_key, record))
    soft = Verdict(float(prob), "ok", parsed.pred)
    return _with_verdict(JudgeOutcome(soft, None, route_key, record))


def default_client() -> JudgeClient:
    """The process-wide ``genrm_client.get_genrm_client()`` singleton (``GENRM_URL``)."""
    client: JudgeClient = get_genrm_client()  # mypy checks the client fits the protocol
    return client


def _failed(err: BaseException, route_key: str | None, latency_s: float) -> JudgeOutcome:
    error = judge_error_result(err)["error"]
    return JudgeOutcome(None, error, route_key, make_record(route_key, latency_s, error=error))


async def judge_one(
    client: JudgeClient,
    call: JudgeCall,
    *,
    sampling_params: SamplingParams | None = None,
    lenient: bool = False,
    verdict: VerdictMode = "strict",
) -> JudgeOutcome:
    """Ask one judge; a ``GenRMError`` becomes a failed outcome."""
    if verdict == "logprob":  # the probability comes in the reply's meta: a one-item batch
        (outcome,) = await judge_many(
            client, [call], sampling_params=sampling_params, lenient=lenient, verdict=verdict
        )
        return outcome
    params = sampling_params.model_dump(exclude_none=True) if sampling_params else None
    # the whole reply (its meta names the engine and the tokens) where the client gives it: a
    # stand-in client that has only ``generate`` still works, its records without the meta
    full = getattr(client, "generate_full", None)
    started = time.perf_counter()
    try:
        if full is not None:
            reply = await full(call.messages, params, call.route_key, prefix_key=call.prefix_key)
        else:
            text = await client.generate(
                call.messages,
                sampling_params=params,
                route_key=call.route_key,
                prefix_key=call.prefix_key,
            )
            reply = GenerateResponse(response=text)
    except GenRMError as err:
        return _failed(err, call.route_key, time.perf_counter() - started)
    return _outcome(reply, call.route_key, lenient, "strict", time.perf_counter() - started)


async def judge_many(
    client: JudgeClient,
    calls: Sequence[JudgeCall],
    *,
    sampling_params: SamplingParams | None = None,
    lenient: bool = False,
    batch_size: int = 64,
    verdict: VerdictMode = "strict",
) -> list[JudgeOutcome]:
    """Ask for many verdicts through ``generate_batch``; failures are per item.

    More than ``batch_size`` calls go out as concurrent chunks (one HTTP request each), so a
    whole deferred rollout batch neither makes one giant request nor waits chunk after chunk.
    """
    if len(calls) > batch_size:
        chunks = [calls[i : i + batch_size] for i in range(0, len(calls), batch_size)]
        parts = await asyncio.gather(
            *(
                judge_many(
                    client, c, sampling_params=sampling_params, lenient=lenient, verdict=verdict
                )
                for c in chunks
            )
        )
        return [outcome for part in parts for outcome in part]
    if not calls:
        return []
    if verdict == "logprob":
        base = sampling_params or SamplingParams()
        sampling_params = base.model_copy(update={"logprob_verdict": True})
    requests = [
        GenerateRequest(
            messages=[Message.model_validate(m) for m in call.messages],
            sampling_params=sampling_params,
            route_key=call.route_key,
            prefix_key=call.prefix_key,
        )
        for call in calls
    ]
    started = time.perf_counter()
    try:
        replies = await client.generate_batch(requests)
    except GenRMError as err:
        latency = time.perf_counter() - started
        return [_failed(err, call.route_key, latency) for call in calls]
    latency = time.perf_counter() - started
    if len(replies) != len(calls):
        raise RuntimeError(
            f"generate_batch returned {len(replies)} results for {len(calls)} requests"
        )
    outcomes: list[JudgeOutcome] = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, GenerateResponse):
            outcomes.append(_outcome(reply, call.route_key, lenient, verdict, latency))
        elif isinstance(reply, GenRMError):
            outcomes.append(_failed(reply, call.route_key, latency))
        else:
            raise TypeError(f"generate_batch returned {type(reply).__name__}, not a response")
    return outcomes


@dataclass(frozen=True)
class Judging:
    """A reward function's judge calls as its settings ask for them: the client (``client`` or
    :func:`default_client`), the request's sampling overrides, lenient verdict parsing, the
    batch size and the verdict mode, read once from ``RewardArgs`` rather than passed again at
    every call."""

    client: JudgeClient
    sampling_params: SamplingParams | None
    lenient: bool
    batch_size: int
    verdict: VerdictMode = "strict"

    @classmethod
    def of(
        cls, settings: RewardArgs, client: JudgeClient | None, *, verdict: VerdictMode = "strict"
    ) -> Judging:
        """``verdict``: dapo-genrm passes ``settings.genrm_verdict``; the others judge strictly."""
        return cls(
            client if client is not None else default_client(),
            settings.reward_sampling_params,
            settings.lenient_verdict,
            settings.judge_batch_size,
            verdict,
        )

    async def one(self, call: JudgeCall) -> JudgeOutcome:
        return await judge_one(
            self.client,
            call,
            sampling_params=self.sampling_params,
            lenient=self.lenient,
            verdict=self.verdict,
        )

    async def many(self, calls: Sequence[JudgeCall]) -> list[JudgeOutcome]:
        return await judge_many(
            self.client,
            calls,
            sampling_params=self.sampling_params,
            lenient=self.lenient,
            batch_size=self.batch_size,
            verdict=self.verdict,
        )
