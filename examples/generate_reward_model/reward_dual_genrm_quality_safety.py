"""Two judges on one GenRM service, one training reward: quality × safety through route_key.

Used by ``run-qwen3-4B-8xgpu-dual-genrm-split.sh``::

    --genrm-instances '{"quality": {...}, "safety": {...}}'
    --custom-rm-path examples.generate_reward_model.reward_dual_genrm_quality_safety.reward_func

The work is genrm-rewards' dual reward (``genrm_rewards.dual.compute_score``): both judges are
asked concurrently — quality with the dapo-genrm consistency prompt when the sample has a
reference answer (``metadata["label"]``), else a reference-free "does it answer correctly"
prompt; safety with the whole response — and their verdicts are combined. This file only pins
the choices a user makes, at the top; edit them here (the equivalent without this file is
``--rm-type dual-genrm`` with the ``--dual-*`` flags).

What ``reward_func`` returns (``--reward-key score`` trains on ``score``):

* both judges answered ``1`` / ``0``: ``score`` = quality × safety (1.0 only for a correct *and*
  safe answer), ``status`` ``"ok"``, ``details`` with each judge's part;
* a judge replied anything else (``"1."``, ``"Yes"``, a thinking trace): strict verdicts make
  that part 0 and the result ``"unparsed"`` — counted in the run's metrics, never mistaken for
  a clean 0;
* a judge failed (service down, unknown route_key, timeout, after genrm-client's retries):
  ``score`` ``None``, ``status`` ``"judge_error"``, ``error`` naming the judge. rl-core leaves such
  a sample out of its group's statistics and the loss — it is never a reward of 0.
"""

from __future__ import annotations

from typing import Any

from genrm_rewards.args import resolve_args
from genrm_rewards.dual import compute_score
from genrm_rewards.types import JudgeClient, RewardResult, SampleLike

#: The route_keys of the two instances, as named in --genrm-instances.
QUALITY_ROUTE_KEY = "quality"
SAFETY_ROUTE_KEY = "safety"
#: How the two verdicts become one score: "product" (safety gates quality), "min", or
#: "weighted_sum" with WEIGHTS (quality, safety).
COMBINE = "product"
WEIGHTS = (0.5, 0.5)
#: Only an exact "1" or "0" is a verdict. True also accepts "1.", "**Yes**", "Judgement: 0"...
LENIENT_VERDICT = False


async def reward_func(
    args: Any, sample: SampleLike, *, client: JudgeClient | None = None, **kwargs: Any
) -> RewardResult:
    """The dual reward of one sample, with this file's choices over the run's settings.

    ``client``: a judge client (tests); by default genrm-client's process-wide one (GENRM_URL).
    """
    settings = resolve_args(args).model_copy(
        update={
            "dual_quality_route_key": QUALITY_ROUTE_KEY,
            "dual_safety_route_key": SAFETY_ROUTE_KEY,
            "dual_combine": COMBINE,
            "dual_weights": WEIGHTS,
            "lenient_verdict": LENIENT_VERDICT,
        }
    )
    return await compute_score(settings, sample, client=client)
