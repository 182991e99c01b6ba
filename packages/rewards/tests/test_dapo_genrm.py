"""dapo-genrm against a test double of the client: statuses, failures, load savers."""

import asyncio

import pytest
from rewards_doubles import Args, JudgeDouble, Sample, answer_block, prompt_text

from genrm_client import (
    GenRMConnectionError,
    GenRMError,
    GenRMHTTPError,
    GenRMOverloadedError,
    GenRMTimeoutError,
    UnknownRouteKeyError,
)
from genrm_client.types import GenerateMeta, GenerateRequest, GenerateResponse
from genrm_rewards import RewardInputError, dapo_genrm
from genrm_rewards.args import resolve_args
from genrm_rewards.dapo_genrm import compute_score, compute_score_batch
from genrm_rewards.errors import RewardConfigError


def sample(answer: str = "42", label: str = "42") -> Sample:
    return Sample(
        response=f"6*7 is... Answer: {answer}", label=label, metadata={"question": "6*7?"}
    )


@pytest.mark.parametrize(
    ("reply", "score", "acc", "status"),
    [("1", 1.0, 1, "ok"), ("0", 0.0, 0, "ok"), ("1.", 0.0, 0, "unparsed")],
)
async def test_verdict_to_result(reply: str, score: float, acc: int, status: str) -> None:
    judge = JudgeDouble(reply)
    result = await compute_score(Args(), sample(), client=judge)
    assert (result["score"], result["acc"], result["status"]) == (score, acc, status)
    assert result["pred"] == reply
    assert len(judge.calls) == 1


FAILURES = [
    GenRMConnectionError("connection refused"),
    GenRMTimeoutError("deadline 30 s passed"),
    GenRMOverloadedError("429 after 2 retries", status=429),
    GenRMHTTPError("500 Internal Server Error", status=500),
    UnknownRouteKeyError("quality", ["__default__"]),
]


@pytest.mark.parametrize("error", FAILURES, ids=lambda e: type(e).__name__)
async def test_judge_failure_is_judge_error_never_zero(error: GenRMError) -> None:
    result = await compute_score(Args(), sample(), client=JudgeDouble(error))
    assert result["status"] == "judge_error"
    assert result["score"] is None and result["acc"] is None
    assert type(error).__name__ in result["error"]
    if isinstance(error, GenRMHTTPError):
        assert f"({error.status})" in result["error"]


async def test_failure_is_not_cached() -> None:
    failing = JudgeDouble(GenRMTimeoutError("slow"))
    assert (await compute_score(Args(), sample(), client=failing))["status"] == "judge_error"
    working = JudgeDouble("1")
    result = await compute_score(Args(), sample(), client=working)
    assert (result["score"], result["cache"]) == (1.0, "miss")
    assert len(working.calls) == 1


async def test_bug_in_client_is_not_swallowed() -> None:
    class Broken(JudgeDouble):
        async def generate(self, *a: object, **k: object) -> str:
            raise KeyError("a bug, not a judge failure")

    with pytest.raises(KeyError):
        await compute_score(Args(), sample(), client=Broken())


async def test_route_key_and_sampling_params_reach_the_client() -> None:
    judge = JudgeDouble("1")
    args = Args(genrm_route_key="math-judge", reward_sampling_params='{"temperature": 0.0}')
    await compute_score(args, sample(), client=judge)
    _, route_key, params = judge.calls[0]
    assert route_key == "math-judge"
    assert params == {"temperature": 0.0}


async def test_question_and_label_fallbacks() -> None:
    judge = JudgeDouble("1")
    s = Sample(
        response="Answer: 3",
        label=None,
        prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2?"}],
        metadata={"label": 3},
    )
    await compute_score(Args(), s, client=judge)
    text = prompt_text(judge.calls[0][0])
    assert "[Question]:\n1+2?" in text and "[Standard Answer]:\n3" in text


async def test_missing_label_is_a_clear_error() -> None:
    with pytest.raises(RewardInputError, match=r"metadata\['label'\] and sample.label"):
        await compute_score(Args(), Sample(response="Answer: 1"), client=JudgeDouble())


async def test_cache_one_call_per_distinct_answer() -> None:
    judge = JudgeDouble(lambda m, r: "1" if "| 42" in answer_block(m) else "0")
    answers = ["42", " 42 ", "$42$.", "41", "42"]
    results = [await compute_score(Args(), sample(a), client=judge) for a in answers]
    assert [r["score"] for r in results] == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert [r["cache"] for r in results] == ["miss", "hit", "hit", "miss", "hit"]
    assert len(judge.calls) == 2


async def test_cache_key_includes_route_and_label() -> None:
    judge = JudgeDouble("1")
    await compute_score(Args(), sample(), client=judge)
    await compute_score(Args(genrm_route_key="other"), sample(), client=judge)
    await compute_score(Args(), sample(label="43"), client=judge)
    assert len(judge.calls) == 3


async def test_cache_off_calls_every_time() -> None:
    judge = JudgeDouble("1")
    for _ in range(3):
        result = await compute_score(Args(verdict_cache=False), sample(), client=judge)
        assert result["cache"] == "off"
    assert len(judge.calls) == 3


async def test_concurrent_same_answer_shares_one_in_flight_call() -> None:
    judge = JudgeDouble("1", delay_s=0.05)
    results = await asyncio.gather(
        *(compute_score(Args(), sample(), client=judge) for _ in range(8))
    )
    assert [r["score"] for r in results] == [1.0] * 8
    assert sorted(r["cache"] for r in results) == ["hit"] * 7 + ["miss"]
    assert len(judge.calls) == 1


async def test_cancelled_owner_does_not_cancel_waiters() -> None:
    judge = JudgeDouble("1", delay_s=0.5)
    owner = asyncio.create_task(compute_score(Args(), sample(), client=judge))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(compute_score(Args(), sample(), client=judge))
    await asyncio.sleep(0.01)
    owner.cancel()
    result = await asyncio.wait_for(waiter, timeout=2)
    assert result["score"] == 1.0
    assert len(judge.calls) == 2  # the waiter asked the judge itself


async def test_rule_gate_skips_the_judge_when_proved_equal() -> None:
    judge = JudgeDouble("0")
    args = Args(rule_gate=True)
    hit = await compute_score(args, sample("\\boxed{\\frac{84}{2}}"), client=judge)
    assert (hit["score"], hit["status"], hit["gate"]) == (1.0, "ok", "hit")
    assert judge.calls == []
    miss = await compute_score(args, sample("41"), client=judge)
    assert (miss["score"], miss["gate"]) == (0.0, "miss")
    assert len(judge.calls) == 1


async def test_gate_off_is_reported() -> None:
    result = await compute_score(Args(), sample(), client=JudgeDouble("1"))
    assert result["gate"] == "off"


async def test_batch_group_one_generate_batch_with_deduplication() -> None:
    judge = JudgeDouble(lambda m, r: "1" if "| 42" in answer_block(m) else "0")
    group = [sample(a) for a in ["42", "41", "42", "42 ", "40", "41", "42", "x"]]
    results = await compute_score_batch(Args(), group, client=judge)
    assert [r["score"] for r in results] == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert judge.batch_calls == 1
    assert len(judge.calls) == 4  # 42, 41, 40, x
    assert [r["cache"] for r in results].count("miss") == 4
    # A second group with the same answers costs nothing.
    again = await compute_score_batch(Args(), group, client=judge)
    assert [r["cache"] for r in again] == ["hit"] * 8
    assert len(judge.calls) == 4


async def test_batch_per_item_failure_only_hits_its_samples() -> None:
    judge = JudgeDouble(
        lambda m, r: GenRMTimeoutError("slow") if "| 41" in answer_block(m) else "1"
    )
    results = await compute_score_batch(
        Args(), [sample("42"), sample("41"), sample("41")], client=judge
    )
    assert [r["status"] for r in results] == ["ok", "judge_error", "judge_error"]
    assert [r["score"] for r in results] == [1.0, None, None]


async def test_batch_whole_call_failure() -> None:
    class Down(JudgeDouble):
        async def generate_batch(
            self, requests: list[GenerateRequest]
        ) -> list[GenerateResponse | GenRMError]:
            raise GenRMConnectionError("connection refused")

    results = await compute_score_batch(Args(), [sample("1"), sample("2")], client=Down())
    assert [(r["status"], r["score"]) for r in results] == [("judge_error", None)] * 2
    assert len(dapo_genrm.verdict_cache()) == 0


async def test_batch_bad_sample_fails_before_any_call() -> None:
    judge = JudgeDouble("1")
    with pytest.raises(RewardInputError):
        await compute_score_batch(Args(), [sample(), Sample(response="Answer: 1")], client=judge)
    assert judge.calls == []


async def test_batch_with_gate_and_no_cache() -> None:
    judge = JudgeDouble("0")
    args = Args(rule_gate=True, verdict_cache=False)
    results = await compute_score_batch(
        args, [sample("42"), sample("41"), sample("41")], client=judge
    )
    assert [r["gate"] for r in results] == ["hit", "miss", "miss"]
    assert [r["cache"] for r in results] == ["off", "off", "off"]
    assert len(judge.calls) == 2


async def test_big_batch_goes_out_in_concurrent_chunks() -> None:
    judge = JudgeDouble("1", delay_s=0.05)
    group = [sample(str(i)) for i in range(10)]
    results = await compute_score_batch(Args(judge_batch_size=4), group, client=judge)
    assert [r["score"] for r in results] == [1.0] * 10
    assert judge.batch_calls == 3  # 4 + 4 + 2
    assert judge.max_in_flight == 3  # sent concurrently, not one after the other


class _ProbJudge(JudgeDouble):
    """Adds ``meta.verdict_prob`` to replies of requests that ask for it, as the hf engine does."""

    def __init__(self, probs: dict[str, float]) -> None:
        super().__init__("1")
        self.probs = probs  # answer → P("1") / (P("1") + P("0"))

    async def generate_batch(
        self, requests: list[GenerateRequest]
    ) -> list[GenerateResponse | GenRMError]:
        replies = await super().generate_batch(requests)
        out: list[GenerateResponse | GenRMError] = []
        for req, reply in zip(requests, replies, strict=True):
            assert isinstance(reply, GenerateResponse)
            if req.sampling_params is not None and req.sampling_params.logprob_verdict:
                text = answer_block([m.model_dump() for m in req.messages])
                prob = next(p for a, p in self.probs.items() if a in text)
                reply = GenerateResponse(response="1", meta=GenerateMeta(verdict_prob=prob))
            out.append(reply)
        return out


async def test_logprob_verdict_is_a_soft_score_from_the_reply_meta() -> None:
    judge = _ProbJudge({"42": 0.8, "41": 0.3})
    args = Args(genrm_verdict="logprob", verdict_cache=False)
    results = await compute_score_batch(args, [sample("42"), sample("41")], client=judge)
    assert [(r["score"], r["acc"], r["status"]) for r in results] == [
        (0.8, 1, "ok"),
        (0.3, 0, "ok"),
    ]
    assert all(params and params["logprob_verdict"] for _, _, params in judge.calls)
    single = await compute_score(args, sample("41"), client=judge)
    assert single["score"] == 0.3
    strict = await compute_score(Args(verdict_cache=False), sample("41"), client=judge)
    assert strict["score"] == 1.0  # strict parsing stays the default


async def test_logprob_verdict_without_a_probability_is_a_judge_error() -> None:
    args = Args(genrm_verdict="logprob", verdict_cache=False)
    result = await compute_score(args, sample(), client=JudgeDouble("1"))
    assert result["status"] == "judge_error" and result["score"] is None
    assert "verdict_prob" in result["error"]


def test_logprob_verdict_refuses_a_thinking_judge() -> None:
    args = Args(
        genrm_verdict="logprob",
        reward_sampling_params='{"chat_template_kwargs": {"enable_thinking": true}}',
    )
    with pytest.raises(RewardConfigError, match="thinking off"):
        resolve_args(args)
    with pytest.raises(RewardConfigError, match="genrm_verdict"):
        resolve_args(Args(genrm_verdict="soft"))


async def test_rule_audit_records_math_verify_beside_the_judge() -> None:
    """The audit never decides the reward: the judge's "1" stands where math-verify says no."""
    judge = JudgeDouble("1")
    args = Args(rule_audit=True, verdict_cache=False)
    answers = ["\\frac{84}{2}", "41", "1EPOCH", ""]
    one = [await compute_score(args, sample(a), client=judge) for a in answers]
    assert [r["rule"] for r in one] == ["equal", "not_equal", "not_equal", "undecided"]
    assert [r["score"] for r in one] == [1.0, 1.0, 1.0, 1.0]
    batch = await compute_score_batch(args, [sample(a) for a in answers], client=judge)
    assert [r["rule"] for r in batch] == [r["rule"] for r in one]
    off = await compute_score(Args(verdict_cache=False), sample("41"), client=judge)
    assert "rule" not in off


def _shared_part(messages: list[dict[str, str]]) -> str:
    """The judge prompt up to the quoted answer: what a GRPO group's requests share."""
    text = prompt_text(messages)
    return text[: text.index("<<<BEGIN MODEL ANSWER>>>")]


async def test_a_groups_judge_requests_carry_one_prefix_key_inline_and_in_batches() -> None:
    judge = JudgeDouble("0")
    group = [sample(a) for a in ["1", "2", "3", "4"]]  # one question and label, four answers
    other_question = Sample(response="Answer: 1", label="42", metadata={"question": "5*8?"})
    other_label = sample("1", label="41")
    # inline: samples scored one by one as their rollouts finish
    for s in [*group, other_question, other_label]:
        await compute_score(Args(), s, client=judge)
    keys = judge.prefix_keys
    assert len(keys) == 6 and all(isinstance(k, str) and k for k in keys)
    assert len(set(keys[:4])) == 1  # the group: one key
    assert len(set(keys)) == 3  # another question or another reference: another key
    # the key stands for the shared prompt prefix: same key, same text before the answer
    prefixes = {k: _shared_part(m) for (m, _, _), k in zip(judge.calls, keys, strict=True)}
    assert len(set(prefixes.values())) == 3
    # a batch (defer mode) of two groups gives the same keys as the inline calls
    batch = JudgeDouble("0")
    dapo_genrm.clear_verdict_cache()
    await compute_score_batch(Args(), [group[0], other_question, *group[1:]], client=batch)
    assert batch.prefix_keys == [keys[0], keys[4], keys[0], keys[0], keys[0]]
