"""Rule-based rewards: answer checking with math-verify (``math``), safe to call from async
code, and the defer-mode placeholder (``dummy``).

math-verify guards its parsing and comparison with ``signal.alarm``, which raises outside the
main thread (Ray actors, FastAPI handlers, thread pools) and cannot be used from an event loop.
So its own timeouts are switched off (``parsing_timeout=None``, ``timeout_seconds=None``) and we
enforce ours: each check runs on a small dedicated thread pool and is awaited under
``asyncio.wait_for``. A check that overruns is reported as a timeout (``None``) and the caller
falls back (the gate asks the judge; the ``math`` reward reports ``judge_error``). The stuck
thread cannot be killed, but the pool is bounded, so a pathological input costs at most one
worker, never the event loop. math-verify (and sympy) import lazily, off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from genrm_rewards.args import resolve_args
from genrm_rewards.limits import MATH_VERIFY_IMPORT_TIMEOUT_S
from genrm_rewards.samples import extract_answer, label_of, response_of
from genrm_rewards.types import RewardResult, SampleLike, deferred_result

__all__ = [
    "RuleDecision",
    "compute_score",
    "dummy",
    "math_decide",
    "math_equal",
    "math_equal_sync",
]

#: What math-verify says about an answer: proved ``equal``, parsed both and found them
#: ``not_equal``, could not parse one side (``undecided``), or overran its deadline.
RuleDecision = Literal["equal", "not_equal", "undecided", "timeout"]
_T = TypeVar("_T")

_POOL_WORKERS = 2
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_imported = False
_loop_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_POOL_WORKERS, thread_name_prefix="genrm-math-verify")
        return _pool


def _import_math_verify() -> None:
    global _imported
    if not _imported:
        import math_verify

        # We disable its signal-based timeouts on purpose and enforce our own (module docstring).
        logging.getLogger(math_verify.__name__).setLevel(logging.ERROR)
        _imported = True


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    stripped = text.strip()
    # Bare answers ("204", "\frac{1}{2}") are math only once delimited; boxed/$ text is as-is.
    delimited = any(m in stripped for m in ("$", "\\boxed", "\\(", "\\["))
    first = stripped if delimited else f"${stripped}$"
    parsed: list[Any] = parse(first, parsing_timeout=None)
    if not parsed and first != stripped:
        parsed = parse(stripped, parsing_timeout=None)
    return parsed


def math_equal_sync(gold: str, pred: str) -> bool:
    """Whether math-verify proves ``pred`` equal to ``gold`` (no timeout; use ``math_equal``)."""
    return math_decide_sync(gold, pred) == "equal"


def math_decide_sync(gold: str, pred: str) -> RuleDecision:
    """Like :func:`math_equal_sync`, but an answer (or label) math-verify cannot parse is
    ``undecided`` rather than unequal: a judge compared against math-verify is compared only
    where math-verify has a view."""
    from math_verify import verify

    _import_math_verify()
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    if not gold_parsed or not pred_parsed:
        return "undecided"
    return "equal" if verify(gold_parsed, pred_parsed, timeout_seconds=None) else "not_equal"


def _slots() -> asyncio.Semaphore:
    """One semaphore per event loop, as wide as the pool (asyncio primitives bind to a loop)."""
    loop = asyncio.get_running_loop()
    sem = _loop_slots.get(loop)
    if sem is None:
        sem = _loop_slots[loop] = asyncio.Semaphore(_POOL_WORKERS)
    return sem


async def _off_loop(
    check: Callable[[str, str], _T], gold: str, pred: str, timeout_s: float
) -> _T | None:
    """``check(gold, pred)`` on the pool under ``timeout_s``; ``None`` if it overran.

    ``timeout_s`` bounds the check itself: waiting for a free worker (a GRPO group queues many
    checks at once) happens before the clock starts, so a busy pool does not fake timeouts.
    """
    loop = asyncio.get_running_loop()
    pool = _get_pool()
    if not _imported:  # the first import (sympy) takes seconds; it must not count as a timeout
        await asyncio.wait_for(
            loop.run_in_executor(pool, _import_math_verify), timeout=MATH_VERIFY_IMPORT_TIMEOUT_S
        )
    async with _slots():
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(pool, check, gold, pred), timeout=timeout_s
            )
        except TimeoutError:
            return None


async def math_equal(gold: str, pred: str, *, timeout_s: float) -> bool | None:
    """Check ``pred == gold`` with math-verify off the event loop; ``None`` if it timed out
    (``timeout_s`` bounds the check, not its wait for a worker)."""
    return await _off_loop(math_equal_sync, gold, pred, timeout_s)


async def math_decide(gold: str, pred: str, *, timeout_s: float) -> RuleDecision:
    """:func:`math_decide_sync` off the event loop, under the same deadline as
    :func:`math_equal` (``"timeout"`` when it overran)."""
    decision = await _off_loop(math_decide_sync, gold, pred, timeout_s)
    return "timeout" if decision is None else decision


async def compute_score(args: Any, sample: SampleLike) -> RewardResult:
    """``--rm-type math``: 1.0 when math-verify proves the extracted answer equals the label.

    No judge: ``status`` is ``"ok"`` with score 1.0 or 0.0, or ``"judge_error"`` (score
    ``None``) when the check overran ``rule_timeout_s`` — an undecided check is not a 0.
    """
    settings = resolve_args(args)
    label = label_of(sample)
    answer = extract_answer(response_of(sample))[: settings.max_answer_chars]
    equal = await math_equal(label, answer, timeout_s=settings.rule_timeout_s)
    if equal is None:
        return {
            "score": None,
            "acc": None,
            "pred": answer.strip()[:200],
            "status": "judge_error",
            "error": f"math-verify did not finish within rule_timeout_s={settings.rule_timeout_s}",
        }
    score = 1.0 if equal else 0.0
    return {"score": score, "acc": int(score), "pred": answer.strip()[:200], "status": "ok"}


async def dummy(args: Any, sample: SampleLike) -> RewardResult:
    """``--rm-type dummy``: inline 0 with status ``"deferred"`` (scored later in the batch, by
    ``genrm_rewards.defer.score_deferred``)."""
    return deferred_result()
