"""A reward for the restart tests (``--custom-rm-path restart_reward.judged_parity``): the
judge service is asked about every sample (so the restart must bring it back), and the score
varies inside a group (so GRPO's advantages are not all 0 and every step changes the weights:
a resumed run that drifted would show in them)."""

from __future__ import annotations

from typing import Any


async def judged_parity(args: Any, sample: Any, client: Any = None) -> dict[str, Any]:
    """1.0 when the judge says "1" and the response has an odd length, else 0.0."""
    reply = await client.generate(messages=[{"role": "user", "content": sample.response or "-"}])
    score = float(reply.strip() == "1" and len(sample.response) % 2 == 1)
    return {"score": score, "status": "ok"}
