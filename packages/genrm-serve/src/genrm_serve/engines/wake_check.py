"""The wake check: after a wake, an engine proves that its weights survived the sleep.

A sleep copies weights to host memory and back (or drops and reloads them, or keeps them in
place); if a wake ever restored wrong weights, the judge would go on answering, confidently, with
a model nobody trained. A judge never lies about a reward, so ``engine_config.wake_check`` (on by
default) has every GPU-capable engine run one fixed greedy probe before it sleeps and again after
it wakes, and compare them:

- the probe: :data:`PROBE_TOKENS` fixed token ids (spread over the tokenizer's base vocabulary, so
  valid for any model), temperature 0, one new token, its log-prob (``return_tokens``, which every
  engine already offers). Run through the engine's own ``generate``: the very path a judge's
  requests take.
- before a sleep, only when no probe is stored for the current weights (the first sleep of each
  weight version); every weight update invalidates the stored one (:meth:`WakeCheck.invalidate`,
  called by each ``update_weights*`` path, and the weight version is checked as well).
- after a wake, always: a different token, or a log-prob further than :data:`LOGPROB_TOLERANCE`
  (:data:`HALF_LOGPROB_TOLERANCE` for an engine with bf16 / fp16 logits) from the stored one,
  fails the wake with an :class:`EngineError` naming the engine, both results and the rule, and
  marks the engine failed, so that its supervisor re-creates it from the model on disk instead
  of it serving garbage.

Cost: one request at a sleep (first per weight version) and one at each wake, each a prefill of
16 tokens and no decode step: milliseconds, against a sleep or wake that moves gigabytes of
weights (seconds).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from genrm_client.types import SamplingParams
from genrm_serve.engines.base import EngineError, EngineFailedError, EngineRequest

if TYPE_CHECKING:
    from genrm_serve.engines.base import Engine

__all__ = [
    "HALF_LOGPROB_TOLERANCE",
    "LOGPROB_TOLERANCE",
    "PROBE_TOKENS",
    "ProbeResult",
    "WakeCheck",
    "logprob_tolerance",
    "probe_token_ids",
]

logger = logging.getLogger(__name__)

#: Prompt length of the probe (tokens); fewer when ``max_context_len`` is smaller.
PROBE_TOKENS = 16
#: Largest difference (nats) allowed between the probe's log-prob before the sleep and after the
#: wake. The same engine runs the same 16 tokens alone (a batch of one) on the same weights, so
#: the two may differ only by kernel nondeterminism: another reduction order in split-K matmuls
#: or attention, kernels re-chosen or CUDA graphs recaptured after a wake, a prefill served from
#: the prefix cache once and computed afresh the other time. In bf16 that moves a log-prob by
#: about 1e-3 to 1e-2 nats (1e-3 itself would be too tight for a GPU); weights that did not come
#: back (fresh pages, another tensor, an older version) move it by tenths of a nat or more and
#: nearly always change the token. 0.02 is above the first and far below the second.
LOGPROB_TOLERANCE = 0.02
#: The same bound for an engine whose logits are bf16 or fp16 (the hf engine in those dtypes):
#: its log-probs come from logits rounded to 8 (bf16) or 11 bits, and bf16 logits of magnitude
#: 16 to 32 lie 0.125 apart, so a kernel that sums in another order moves the token's logit, and
#: the log-sum-exp, by a step each. Seen on the 2-core AVX-512-bf16 CPU: the same token at
#: -2.0259 and -1.9369 around one sleep of the Gemma 3 270M rollout engine, weights intact.
#: Weights that did not come back still change the token (the check's first rule).
HALF_LOGPROB_TOLERANCE = 0.3
#: Spacing of the probe's ids in the vocabulary (a prime: the ids do not fall on a pattern of it).
_STRIDE = 7919


@dataclass(frozen=True)
class ProbeResult:
    """The probe's greedy token and its log-prob."""

    token: int
    logprob: float

    def __str__(self) -> str:
        return f"token {self.token} (logprob {self.logprob:.4f})"


def probe_token_ids(vocab_size: int, max_context_len: int) -> list[int]:
    """The probe's prompt: fixed ids below ``vocab_size``, short enough for the context (room
    for the one new token)."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size} must be positive")
    n = max(1, min(PROBE_TOKENS, max_context_len // 2))
    return [(11 + _STRIDE * i) % vocab_size for i in range(n)]


def logprob_tolerance(logits_dtype: str) -> float:
    """The probe's log-prob bound for an engine whose logits are of ``logits_dtype``."""
    half = logits_dtype.removeprefix("torch.") in ("bfloat16", "float16", "bf16", "fp16")
    return HALF_LOGPROB_TOLERANCE if half else LOGPROB_TOLERANCE


class WakeCheck:
    """One engine's probe before a sleep and after a wake (see the module docstring).

    The engine calls :meth:`before_sleep` while still awake, :meth:`after_wake` once awake
    again, and :meth:`invalidate` whenever its weights legitimately change. ``counters`` (the
    engine's own) gets ``wake_checks`` and ``wake_check_failures``.
    """

    def __init__(
        self, engine: Engine, counters: dict[str, int], tolerance: float = LOGPROB_TOLERANCE
    ) -> None:
        self.engine = engine
        self.counters = counters
        #: nats between the two probes' log-probs allowed (``logprob_tolerance`` of the engine's
        #: logits dtype, which an engine may set once it knows it)
        self.tolerance = tolerance
        counters.setdefault("wake_checks", 0)
        counters.setdefault("wake_check_failures", 0)
        #: the probe of the current weights, and the weight version it was taken at
        self.reference: ProbeResult | None = None
        self.reference_version: int | None = None
        #: the prompt of the probe, set by :meth:`before_sleep`
        self.prompt: list[int] | None = None

    @property
    def enabled(self) -> bool:
        return self.engine.spec.engine_config.wake_check

    def invalidate(self) -> None:
        """The weights are changing (an update): the stored probe no longer describes them."""
        self.reference = None
        self.reference_version = None

    async def _run(self) -> ProbeResult:
        assert self.prompt is not None
        sampling = SamplingParams(
            temperature=0.0, top_p=1.0, top_k=-1, max_response_len=1, stop=[], seed=0
        ).merged_over(self.engine.spec.sampling_config)
        request = EngineRequest(
            sampling=sampling.model_copy(update={"logprob_verdict": False}),
            prompt_token_ids=list(self.prompt),
            return_tokens=True,
            request_id="wake-check",
        )
        (out,) = await self.engine.generate([request])
        if not out.token_ids or not out.logprobs:
            raise EngineError(
                f"engine {self.engine.engine_id}: the wake-check probe returned no token "
                f"(finish_reason={out.finish_reason})"
            )
        return ProbeResult(int(out.token_ids[0]), float(out.logprobs[0]))

    async def before_sleep(self, vocab_size: int) -> None:
        """Take the probe of the current weights, unless one is stored already."""
        if not self.enabled:
            return
        version = self.engine.weight_version
        if self.reference is not None and self.reference_version == version:
            return
        max_context = self.engine.spec.engine_config.max_context_len
        self.prompt = probe_token_ids(vocab_size, max_context)
        try:
            self.reference = await self._run()
        except Exception as err:
            self.invalidate()
            raise EngineError(
                f"engine {self.engine.engine_id}: the wake-check probe failed before the sleep "
                f"({type(err).__name__}: {err}); not sleeping"
            ) from err
        self.reference_version = version

    async def after_wake(self) -> None:
        """Run the probe again; a different result fails the engine (see the module docstring)."""
        if not self.enabled or self.reference is None:
            return
        before = self.reference
        self.counters["wake_checks"] += 1
        try:
            after = await self._run()
        except Exception as err:
            why = f"its wake-check probe could not run after the wake: {err}"
            raise self._failure(why) from err
        if after.token == before.token and abs(after.logprob - before.logprob) <= self.tolerance:
            return
        raise self._failure(
            f"wake check failed at weight version {self.engine.weight_version}: the greedy probe "
            f"gave {before} before the sleep and {after} after the wake; the same token within "
            f"{self.tolerance} nats is required (the weights did not survive the sleep)"
        )

    def _failure(self, why: str) -> EngineFailedError:
        """Count the failure, mark the engine failed; the error to raise."""
        self.counters["wake_check_failures"] += 1
        self.invalidate()
        message = f"engine {self.engine.engine_id}: {why}"
        logger.error("%s; marking the engine failed", message)
        self.engine.mark_failed(why)
        return EngineFailedError(message)
