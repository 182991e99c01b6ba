"""The run of the restart tests and of ``benchmarks/chaos.py``, and its reward
(``--custom-rm-path restart_reward.judged_parity``): the judge service is asked about every
sample (so a restart must bring it back), and the score varies inside a group (so GRPO's
advantages are not all 0 and every step changes the weights: a resumed run that drifted would
show in them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from genrm_serve.testing import scripted_model_path


def restart_run_argv(
    root: Path, model: Path, data: Path, name: str, steps: int, *extra: str
) -> list[str]:
    """``rl-core train`` flags of a ``steps``-step run into ``root/name/{run,ckpt}``: local Ray,
    two trainer ranks, the hf rollout engine, a scripted judge, colocated, seeded, saved every
    step."""
    judge = {
        "__default__": {
            # a judge call takes 0.1 s: the steps after the first last long enough for a
            # kill at a random time to land inside them
            "model_path": scripted_model_path(default="1", delay_s=0.1),
            "num_gpus": 1,
            "engine": "scripted",
        }
    }
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--custom-rm-path", "restart_reward.judged_parity",
        "--genrm-instances", json.dumps(judge),
        "--num-rollout", str(steps), "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "6", "--keep-cut-off", "--lr", "1e-3", "--seed", "7",
        "--colocate", "--resource", '{"actor": [1, 2], "rollout": [1, 1], "genrm": [1, 1]}',
        "--device", "cpu",
        "--run-dir", str(root / name / "run"), "--save", str(root / name / "ckpt"),
        "--save-interval", "1", *extra,
    ]  # fmt: skip


async def judged_parity(args: Any, sample: Any, client: Any = None) -> dict[str, Any]:
    """1.0 when the judge says "1" and the response has an odd length, else 0.0."""
    reply = await client.generate(messages=[{"role": "user", "content": sample.response or "-"}])
    score = float(reply.strip() == "1" and len(sample.response) % 2 == 1)
    return {"score": score, "status": "ok"}
