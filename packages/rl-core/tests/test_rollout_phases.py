"""Rollout helpers (prompt encoding, stop strings) and the phase state machine's ordering."""

import pytest
from rich.console import Console

from genrm_serve.engines.base import EngineOutput
from rl_core.config import build_config
from rl_core.phases import PhaseMachine, phases_from_plan
from rl_core.rollout import RolloutError, RolloutSettings, apply_stop, encode_prompt, fill_sample
from rl_core.sample import Sample
from rl_core.summary import render_summary
from rl_core.trainer import StepRecord


def test_encode_prompt_string_and_chat_without_template(char_tokenizer):
    assert encode_prompt(char_tokenizer, "1+1", chat=False)[0] == 1  # BOS added
    chat = [{"role": "user", "content": "1+1"}, {"role": "user", "content": "2"}]
    assert encode_prompt(char_tokenizer, chat, chat=False) == encode_prompt(
        char_tokenizer, "1+1\n\n2", chat=False
    )


@pytest.mark.parametrize(
    ("text", "stop", "kept"),
    [
        pytest.param(" 7\nQuestion", ["\n"], " 7\n", id="cut-after-newline"),
        pytest.param(" 12", ["\n"], " 12", id="no-stop-hit"),
        pytest.param(" 7", [], " 7", id="no-stop-strings"),
    ],
)
def test_stop_strings_cut_tokens_and_logprobs(char_tokenizer, text, stop, kept):
    tokens = char_tokenizer(text, add_special_tokens=False)["input_ids"]
    out = EngineOutput(
        text=text,
        finish_reason="length",
        prompt_tokens=3,
        completion_tokens=len(tokens),
        token_ids=tokens,
        logprobs=[-0.1 * (i + 1) for i in range(len(tokens))],
        weight_version=4,
    )
    s = Sample(prompt="p", label="7", metadata={}, group_id=0)
    fill_sample(s, out, char_tokenizer, RolloutSettings(4, 8, stop=tuple(stop)))
    assert s.response == kept
    assert len(s.response_tokens) == len(s.rollout_logprobs) == len(kept)
    assert s.finish_reason == ("stop" if kept != text else "length")
    assert s.weight_version == 4
    assert apply_stop(char_tokenizer, tokens, stop)[0] == len(kept)


def test_missing_logprobs_is_an_error(char_tokenizer):
    out = EngineOutput(
        text="x",
        finish_reason="stop",
        prompt_tokens=1,
        completion_tokens=1,
        token_ids=[5],
        logprobs=None,
    )
    with pytest.raises(RolloutError, match="log-probs"):
        fill_sample(Sample("p", "1", {}, 0), out, char_tokenizer, RolloutSettings(2, 4))


#: flag values of the layout each mode comes from (one judge, the smallest layout of the mode)
_MODE_FLAGS = {
    "colocate-split": {"rm_type": "math"},
    "colocate-defer-swap": {
        "rm_type": "dummy",
        "defer_reward_to_post_process": True,
        "builtin_reward_post_process": True,
    },
    "fully-async": {"rm_type": "math", "fully_async": True},
}


def _plan(mode):
    cfg = build_config(
        hf_checkpoint="m",
        prompt_data="d.jsonl",
        genrm_model_path="scripted",
        genrm_engine="scripted",
        **_MODE_FLAGS[mode],
    )
    assert cfg.mode == mode
    return cfg.plan


class Rec:
    def __init__(self, name, log):
        self.name, self.log = name, log

    async def sleep(self):
        self.log.append(f"{self.name}.sleep")

    async def wake(self):
        self.log.append(f"{self.name}.wake")


@pytest.mark.parametrize(
    ("mode", "sequence", "expected"),
    [
        pytest.param(
            "colocate-split",
            ["inference", "train", "inference"],
            [
                "actor.sleep",
                "rollout.sleep",
                "judge.sleep",
                "actor.wake",
                "actor.sleep",
                "rollout.wake",
                "judge.wake",
            ],
            id="split",
        ),
        pytest.param(
            "colocate-defer-swap",
            ["inference", "reward", "train", "inference"],
            [
                "judge.sleep",
                "actor.sleep",
                "rollout.sleep",
                "judge.wake",
                "judge.sleep",
                "actor.wake",
                "actor.sleep",
                "rollout.wake",
            ],
            id="defer-swap",
        ),
        pytest.param("fully-async", ["inference", "train"], [], id="fully-async-never-sleeps"),
    ],
)
async def test_phase_machine_sleeps_before_it_wakes(mode, sequence, expected):
    log: list[str] = []
    m = PhaseMachine(
        phases_from_plan(_plan(mode)),
        {
            "rollout": Rec("rollout", log),
            "genrm:__default__": Rec("judge", log),
            "actor": Rec("actor", log),
        },
    )
    for phase in sequence:
        await m.enter(phase)
    # within one transition concurrent sleeps may come in any order, but all before any wake
    assert sorted(log) == sorted(expected)
    for phase in set(sequence):
        actions = [a for p, _, a in m.log if p == phase]
        assert actions == sorted(actions, key=lambda a: a != "sleep"), (phase, actions)
    with pytest.raises(KeyError, match="not in this mode"):
        await m.enter("nope")


def test_summary_names_gate_and_judge():
    rec = StepRecord(
        1,
        {
            "rollout/reward_mean": 0.5,
            "rollout/samples": 4,
            "adv/nonzero": 4,
            "eval/samples": 2,
            "eval/accuracy": 0.5,
        },
        {"rollout": 1.0, "train": 2.0},
        verdicts={"gate": 3, "judge": 1},
    )
    console = Console(record=True, width=200)
    render_summary([rec], mode="colocate-split", startup={"ray": 1.0}, total_s=3.0, console=console)
    text = console.export_text()
    assert "rule gate" in text and "judge (GenRM verdict)" in text
    assert "eval after step 1" in text and "colocate-split" in text


async def test_judge_outage_is_a_judge_error_but_a_reward_bug_stops_the_run() -> None:
    from genrm_client import GenRMConnectionError
    from rl_core.rewards import InlineRewards
    from rl_core.sample import Sample

    async def down(args: object, sample: Sample) -> dict:
        raise GenRMConnectionError("judge unreachable")

    async def buggy(args: object, sample: Sample) -> dict:
        return {"score": sample.metadata["missing"]}

    outage = InlineRewards(down, None, reward_key="score", concurrency=2)
    s = Sample(prompt="p", label="1", metadata={}, group_id=0, response="r")
    outage.submit([s])
    await outage.drain()
    assert (s.status, s.reward) == ("judge_error", None)

    bug = InlineRewards(buggy, None, reward_key="score", concurrency=2)
    bug.submit([Sample(prompt="p", label="1", metadata={}, group_id=0, response="r")])
    with pytest.raises(KeyError, match="missing"):
        await bug.drain()
