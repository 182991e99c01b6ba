"""Building blocks of a tiny in-process GRPO run, shared by the trainer tests (through the
``grpo_config`` / ``grpo_trainer`` fixtures of conftest.py) and test_judge_e2e.py.

All build the same stack (a started rollout test engine behind a local handle, the torch backend,
the phase machine) and the same trainer around it; they differ only in the judge they put in the
``genrm:__default__`` phase and in the reward setup, which the caller passes in.
"""

import json
from pathlib import Path
from typing import Any

from rl_core.backends.base import BackendConfig
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.data import load_prompt_data, make_easy_math
from rl_core.distributed import LocalLearner
from rl_core.engines import LocalEngineHandle
from rl_core.evaluation import Evaluation
from rl_core.grpo.loss import LossConfig
from rl_core.metrics import PhaseClock
from rl_core.phases import CallbackSleeper, GroupSleeper, PhaseMachine, phases_from_plan
from rl_core.rewards import RewardSetup
from rl_core.stopping import StopRequest
from rl_core.trainer import GRPOTrainer


def write_easy_math_data(path: Path) -> Path:
    """Eight generated easy-math prompts (1 shot) as a JSONL prompt file at ``path``."""
    with path.open("w") as f:
        for r in make_easy_math(8, seed=1, shots=1):
            f.write(
                json.dumps({"prompt": r.prompt, "label": r.label, "metadata": r.metadata}) + "\n"
            )
    return path


async def local_stack(cfg: Any, model_path: Any, make_engine: Any, judge: Any) -> Any:
    """``(engine, handle, backend, phases)``: a started test engine, the backend, the phases."""
    engine = make_engine(model_path)
    await engine.start()
    handle = LocalEngineHandle(engine)
    backend = TorchHFBackend(
        model_path,
        BackendConfig(
            lr=cfg.lr,
            temperature=cfg.rollout_temperature,
            seed=cfg.seed,
            loss=LossConfig(use_tis=cfg.use_tis),
        ),
    )
    phases = PhaseMachine(
        phases_from_plan(cfg.plan),
        {
            "rollout": GroupSleeper([handle]),
            "genrm:__default__": judge,
            "actor": CallbackSleeper(backend.offload, backend.onload),
        },
    )
    return engine, handle, backend, phases


def make_trainer(
    cfg: Any,
    tokenizer: Any,
    handle: Any,
    backend: Any,
    phases: Any,
    rewards: RewardSetup,
    *,
    evaluation: Evaluation | None = None,
    stop: StopRequest | None = None,
) -> GRPOTrainer:
    """The trainer of the stack from ``local_stack``, on ``cfg.prompt_data``, quiet clock."""
    return GRPOTrainer(
        cfg,
        learner=LocalLearner(backend),
        tokenizer=tokenizer,
        rollout_engines=[handle],
        phases=phases,
        rewards=rewards,
        train_data=load_prompt_data(cfg.prompt_data),
        evaluation=evaluation,
        stop=stop,
        overlap=cfg.plan.phases_overlap,
        clock=PhaseClock(show=False),
    )


class RecordingJudge:
    """The judge of the phase machine: logs its sleeps and wakes (to ``log``)."""

    def __init__(self, log: list[Any]) -> None:
        self.log, self.state = log, "active"

    async def sleep(self) -> None:
        self.log.append("judge.sleep")
        self.state = "asleep"

    async def wake(self) -> None:
        self.log.append("judge.wake")
        self.state = "active"


class ScriptedReward:
    """A deterministic test reward: 1.0 when the response has a digit, else 0.0; every
    ``fail_every``-th call is a judge error (score None)."""

    def __init__(self, fail_every: int = 0) -> None:
        self.calls, self.fail_every = 0, fail_every

    async def __call__(self, args: Any, sample: Any) -> dict[str, Any]:
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            return {"score": None, "status": "judge_error", "error": "test judge down"}
        score = 1.0 if any(c.isdigit() for c in sample.response) else 0.0
        return {"score": score, "status": "ok", "gate": "miss", "acc": int(score)}
