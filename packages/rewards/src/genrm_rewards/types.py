"""The reward contract: what a reward function receives and what it returns.

A reward function is ``async def fn(args, sample) -> dict`` and its group/batch variant
``async def fn(args, samples) -> list[dict]``. The returned dict always has ``score`` and
``status``; ``status`` is what lets a trainer tell a real 0 from a failed judge:

- ``"ok"``: the judge (or rule) gave a clean verdict; ``score`` is it.
- ``"unparsed"``: the judge answered but not with a clean verdict; ``score`` is 0.0, counted
  separately so a badly prompted judge is visible instead of silently zeroing a run.
- ``"judge_error"``: transport failure, timeout, overload or 5xx after the client's retries;
  ``score`` is ``None``, never 0: under GRPO a spurious 0 hands the rest of the group a false
  positive advantage, so the trainer must drop the sample from the loss and the group baseline.
- ``"deferred"``: no score yet (``dummy`` in defer mode); a post-process step fills it in.
- ``"judge_timeout"``: not judged before the group's deadline (``group_judge_deadline_s``);
  ``score`` is ``None`` as for a judge error, but counted apart: a deadline is a choice, not
  an outage.

The types are plain dicts (``TypedDict``) so existing trainers that index ``result["score"]``
keep working, and samples are a structural ``Protocol`` so any trainer's sample type fits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, Required, TypedDict

from genrm_client import GenRMError
from genrm_client.types import GenerateRequest, GenerateResponse
from genrm_rewards.records import JudgeRecord

__all__ = [
    "BatchRewardFn",
    "JudgeClient",
    "RewardFn",
    "RewardResult",
    "RewardStatus",
    "SampleLike",
    "deferred_result",
    "judge_error_result",
    "judge_timeout_result",
]

RewardStatus = Literal["ok", "unparsed", "judge_error", "deferred", "judge_timeout"]
#: Statuses whose ``score`` is a real number a trainer may learn from.
SCORED_STATUSES: frozenset[str] = frozenset({"ok", "unparsed"})


class SampleLike(Protocol):
    """What a reward function reads from a sample (rl-core's ``Sample`` satisfies it).

    ``prompt`` is the policy's prompt: a string or a list of chat messages
    (``{"role", "content"}``). ``label`` is the reference answer, ``metadata`` free-form
    (``question``, ``label``, ``trajectory_steps``, ...).
    """

    @property
    def prompt(self) -> str | Sequence[Mapping[str, Any]]: ...

    @property
    def response(self) -> str: ...

    @property
    def label(self) -> Any: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...


class RewardResult(TypedDict, total=False):
    """The dict every built-in reward function returns.

    ``score`` and ``status`` are always present; ``acc`` and ``pred`` follow the original
    dapo-genrm contract (``acc`` is ``int(score)``, ``pred`` the judge's stripped reply or the
    rule's parsed answer); the rest say which load savers were used and why a call failed.
    """

    score: Required[float | None]
    status: Required[RewardStatus]
    acc: int | None
    pred: str | None
    #: rule gate: "hit" (math-verify proved it equal, no judge call), "miss", "timeout", "off"
    gate: Literal["hit", "miss", "timeout", "off"]
    #: rule audit (or gate): what math-verify says about the answer — "equal", "not_equal",
    #: "undecided" (it could not parse a side) or "timeout"; absent when neither is on
    rule: Literal["equal", "not_equal", "undecided", "timeout"]
    #: verdict cache: "hit" (reused an earlier or in-flight judge call), "miss", "off"
    cache: Literal["hit", "miss", "off"]
    route_key: str | None
    #: why a judge call failed (only with status "judge_error")
    error: str
    #: what the prompt builder neutralised in the judged answer (``quoting.neutralised_kinds``:
    #: template tokens, block markers, template headers, judge-directed lines); absent if none
    neutralised: list[str]
    #: function-specific parts: dual judge scores, per-step verdicts, ...
    details: dict[str, Any]
    #: every judge call made for this sample, in order (``records.JudgeRecord``)
    judge_calls: list[JudgeRecord]


class JudgeClient(Protocol):
    """The part of ``genrm_client.AsyncGenRMClient`` the reward functions use.

    Injectable so unit tests run without a network; production code takes the process-wide
    ``genrm_client.get_genrm_client()`` singleton.
    """

    async def generate(
        self,
        messages: list[dict[str, str]],
        sampling_params: dict[str, Any] | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
    ) -> str: ...

    async def generate_batch(
        self, requests: list[GenerateRequest]
    ) -> list[GenerateResponse | GenRMError]: ...


RewardFn = Callable[[Any, SampleLike], Awaitable[Mapping[str, Any]]]
BatchRewardFn = Callable[[Any, Sequence[SampleLike]], Awaitable[Sequence[Mapping[str, Any]]]]


def judge_error_result(err: BaseException, *, route_key: str | None = None) -> RewardResult:
    """A failed judge call: score ``None`` (never 0) and the error named (with its HTTP status)."""
    status = getattr(err, "status", None)
    name = f"{type(err).__name__}({status})" if isinstance(status, int) else type(err).__name__
    return {
        "score": None,
        "acc": None,
        "pred": None,
        "status": "judge_error",
        "route_key": route_key,
        "error": f"{name}: {err}",
    }


def deferred_result() -> RewardResult:
    """The inline placeholder of defer mode: 0 now, the real score after the batch."""
    return {"score": 0.0, "acc": 0, "pred": None, "status": "deferred"}


def judge_timeout_result(deadline_s: float, *, route_key: str | None = None) -> RewardResult:
    """A sample not judged by its group's deadline: score ``None`` (never 0), its own status."""
    return {
        "score": None,
        "acc": None,
        "pred": None,
        "status": "judge_timeout",
        "route_key": route_key,
        "error": f"not judged within group_judge_deadline_s={deadline_s:g} of the group's last "
        "response",
    }
