"""The reward path a config asks for, handed the run's judge client: rl-core's own reward
functions reach the judge through it, never through ``GENRM_URL``."""

from __future__ import annotations

from typing import Any

import pytest

from genrm_client import GenerateResponse
from rl_core.config import build_config
from rl_core.rewards import reward_setup, with_judge
from rl_core.sample import Sample

#: where a client made from the environment would go: nothing listens there
NOWHERE = "http://127.0.0.1:9/genrm"


class FakeJudge:
    """A judge client that says 1 to everything and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, messages: Any, sampling_params: Any = None, route_key: Any = None,
                       *, prefix_key: Any = None) -> str:  # fmt: skip
        self.calls += 1
        return "1"

    async def generate_batch(self, requests: list[Any]) -> list[GenerateResponse]:
        self.calls += len(requests)
        return [GenerateResponse(response="1") for _ in requests]


def _cfg(tmp_path: Any, **kw: Any) -> Any:
    return build_config(
        hf_checkpoint="m",
        prompt_data="d.jsonl",
        genrm_model_path="scripted",
        genrm_engine="scripted",
        run_dir=str(tmp_path),
        **kw,
    )


def _sample(i: int = 0, answer: str = "7") -> Sample:
    s = Sample(prompt="What is 5+7?", label="12", metadata={"question": "What is 5+7?"}, group_id=0)
    # wrong (a fresh answer per test: no verdict cached): the rule gate leaves it to the judge
    s.index, s.response = i, f"The answer is {answer}."
    return s


async def test_an_inline_judge_reward_asks_the_client_it_was_handed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENRM_URL", NOWHERE)
    judge = FakeJudge()
    setup = reward_setup(_cfg(tmp_path, rm_type="dapo-genrm"), judge=judge)
    assert setup.inline_fn is not None and not setup.deferred
    result = await setup.inline_fn(setup.args, _sample())
    assert judge.calls == 1 and result["status"] == "ok" and result["score"] == 1.0


async def test_a_deferred_batch_asks_the_client_it_was_handed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENRM_URL", NOWHERE)
    judge = FakeJudge()
    cfg = _cfg(
        tmp_path,
        rm_type="dummy",
        defer_reward_to_post_process=True,
        builtin_reward_post_process=True,
    )
    setup = reward_setup(cfg, judge=judge)
    assert setup.deferred and setup.batch_fn is not None
    results = await setup.batch_fn(setup.args, [_sample(0, "8"), _sample(1, "9")])
    assert judge.calls == 2 and [r["score"] for r in results] == [1.0, 1.0]


def test_a_function_without_a_client_argument_is_left_as_it_is() -> None:
    async def own(args: Any, sample: Any) -> dict[str, Any]:
        return {"score": 1.0}

    assert with_judge(own, FakeJudge()) is own
