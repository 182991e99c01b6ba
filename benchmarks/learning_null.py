"""The null control's reward for ``benchmarks/learning.py``: a coin, blind to the answer.

It pays 1 at the rate ``GENRM_NULL_RATE`` (the judge run's share of 1s, so the two runs see the
same amount of reward) and 0 otherwise, whatever the response says. A run trained on it shows
what GRPO's machinery does to the policy with no signal at all: any gain the judge run makes
beyond this run's is the judge's doing. math-verify still records what it thinks of each
answer (``rule``), so the run's own audit shows its real accuracy; it never sets the score.
"""

from __future__ import annotations

import os
import random
from typing import Any

from genrm_rewards.rules import math_decide
from genrm_rewards.samples import extract_answer, label_of, response_of

_rate = float(os.environ.get("GENRM_NULL_RATE", "0.5"))
_coin = random.Random(int(os.environ.get("GENRM_NULL_SEED", "1")))


async def score(args: Any, sample: Any) -> dict[str, Any]:
    """``--custom-rm-path learning_null:score``."""
    rule = await math_decide(label_of(sample), extract_answer(response_of(sample)), timeout_s=5.0)
    value = 1.0 if _coin.random() < _rate else 0.0
    return {"score": value, "acc": int(value), "pred": "coin", "status": "ok", "rule": rule}
