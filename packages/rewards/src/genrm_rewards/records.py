"""What each judge call leaves on its sample's line: who answered, what it cost, what it said.

People who train with a judge spend their days reading what the judge said; a sample judged by
a panel, a rubric or pairwise comparisons makes several calls, so each call gets a record of its
own, in order, under the result's ``judge_calls``. A record is bounded: the raw reply is cut at
:data:`REPLY_CHARS` and the cut is marked (``reply_cut``: how many characters went).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from genrm_client.types import GenerateMeta

if TYPE_CHECKING:  # judge.py imports this module
    from genrm_rewards.judge import JudgeOutcome

__all__ = ["REPLY_CHARS", "JudgeRecord", "cut_reply", "make_record", "records_of"]

#: The raw reply's length kept in a record (a thinking judge writes pages).
REPLY_CHARS = 1000


class JudgeRecord(TypedDict, total=False):
    """One judge call. Absent keys: the engine did not say (the scripted engine, an old server)."""

    #: the instance asked (``None``: the default one)
    route_key: str | None
    #: the engine that answered (``route_key/index``), as the service's reply names it
    engine: str
    prompt_tokens: int
    reply_tokens: int
    #: prompt tokens the engine did not compute for this call alone (prefix cache or sharing)
    cached_prompt_tokens: int
    #: seconds from the request to the reply, client side (a batched call: the batch's)
    latency_s: float
    #: seconds the engine spent, queue included, as it reports them
    engine_latency_s: float
    #: the raw reply, thinking included, cut at REPLY_CHARS
    reply: str
    #: characters cut from the end of ``reply`` (only when it was cut)
    reply_cut: int
    #: the parsed verdict: the stripped reply (``pred``) and its score, or the failure
    verdict: str | None
    score: float | None
    status: Literal["ok", "unparsed", "judge_error"]
    error: str
    #: "hit": no new call, the verdict of this earlier call was reused (the verdict cache)
    cache: Literal["hit"]


def cut_reply(text: str, limit: int = REPLY_CHARS) -> tuple[str, int]:
    """``text`` at most ``limit`` characters, and how many were cut."""
    return (text, 0) if len(text) <= limit else (text[:limit], len(text) - limit)


def make_record(
    route_key: str | None,
    latency_s: float,
    *,
    reply: str | None = None,
    meta: GenerateMeta | None = None,
    error: str | None = None,
) -> JudgeRecord:
    """The record of one call, before its verdict is parsed (``with_verdict`` adds it)."""
    record: JudgeRecord = {"route_key": route_key, "latency_s": round(latency_s, 6)}
    if meta is not None:
        fields: dict[str, Any] = {
            "engine": meta.engine_id,
            "prompt_tokens": meta.prompt_tokens,
            "reply_tokens": meta.completion_tokens,
            "cached_prompt_tokens": meta.cached_prompt_tokens,
            "engine_latency_s": meta.engine_latency_s,
        }
        record.update({k: v for k, v in fields.items() if v is not None})  # type: ignore[typeddict-item]
    if reply is not None:
        kept, cut = cut_reply(reply)
        record["reply"] = kept
        if cut:
            record["reply_cut"] = cut
    if error is not None:
        record["verdict"] = record["score"] = None
        record["status"] = "judge_error"
        record["error"] = error
    return record


def records_of(outcomes: Iterable[JudgeOutcome]) -> list[JudgeRecord]:
    """The records of several outcomes, in order: a composite reward's."""
    return [o.record for o in outcomes if o.record is not None]
