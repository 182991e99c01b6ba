"""Every judge call leaves a record on its sample's result (``judge_calls``): the instance and
engine, the tokens, the latency, the raw reply (cut and marked when long) and the parsed verdict;
a failed call and a verdict reused from the cache say so."""

from __future__ import annotations

from typing import Any

from rewards_doubles import Args, JudgeDouble, Sample

from genrm_client import GenRMOverloadedError
from genrm_client.types import GenerateMeta, GenerateRequest, GenerateResponse
from genrm_rewards import dapo_genrm, dual
from genrm_rewards.records import REPLY_CHARS


def _meta(route_key: str | None) -> GenerateMeta:
    return GenerateMeta(
        prompt_tokens=120,
        completion_tokens=1,
        cached_prompt_tokens=96,
        route_key=route_key or "__default__",
        engine_id=f"{route_key or '__default__'}/1",
        engine_latency_s=0.25,
    )


class MetaJudge(JudgeDouble):
    """The double answering as the real client does: whole replies with the service's meta."""

    async def generate_full(
        self,
        messages: list[dict[str, str]],
        sampling_params: dict[str, Any] | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
    ) -> GenerateResponse:
        text = await self.generate(messages, sampling_params, route_key, prefix_key=prefix_key)
        return GenerateResponse(response=text, meta=_meta(route_key))

    async def generate_batch(self, requests: list[GenerateRequest]) -> list[Any]:
        out = await super().generate_batch(requests)
        return [
            GenerateResponse(response=r.response, meta=_meta(q.route_key))
            if isinstance(r, GenerateResponse)
            else r
            for r, q in zip(out, requests, strict=True)
        ]


def _sample(answer: str = "42") -> Sample:
    return Sample(response=f"Answer: {answer}", label="42", metadata={"question": "6*7?"})


async def test_a_judged_sample_records_its_call_inline_and_in_a_batch() -> None:
    args = Args(verdict_cache=False, genrm_route_key="math")
    one = await dapo_genrm.compute_score(args, _sample(), client=MetaJudge("1"))
    (batched,) = await dapo_genrm.compute_score_batch(args, [_sample()], client=MetaJudge("1"))
    for result in (one, batched):
        (record,) = result["judge_calls"]
        assert record["route_key"] == "math" and record["engine"] == "math/1"
        assert (record["prompt_tokens"], record["reply_tokens"]) == (120, 1)
        assert record["cached_prompt_tokens"] == 96 and record["engine_latency_s"] == 0.25
        assert record["latency_s"] >= 0
        assert (record["reply"], record["verdict"], record["score"]) == ("1", "1", 1.0)
        assert record["status"] == "ok" and "reply_cut" not in record


async def test_a_client_without_replies_meta_still_records_what_it_can() -> None:
    result = await dapo_genrm.compute_score(
        Args(verdict_cache=False), _sample(), client=JudgeDouble("0")
    )
    (record,) = result["judge_calls"]
    assert record["reply"] == "0" and record["score"] == 0.0 and "engine" not in record


async def test_a_long_reply_is_cut_and_the_cut_is_marked() -> None:
    reply = "<think>" + "x" * 3000 + "</think>1"
    result = await dapo_genrm.compute_score(
        Args(verdict_cache=False), _sample(), client=MetaJudge(reply)
    )
    (record,) = result["judge_calls"]
    assert len(record["reply"]) == REPLY_CHARS
    assert record["reply_cut"] == len(reply) - REPLY_CHARS
    assert record["verdict"] == "1"  # parsed from the whole reply, not the cut one


async def test_a_failed_call_is_recorded_as_a_judge_error() -> None:
    judge = MetaJudge(GenRMOverloadedError("busy", status=429))
    result = await dapo_genrm.compute_score(Args(verdict_cache=False), _sample(), client=judge)
    assert result["status"] == "judge_error" and result["score"] is None
    (record,) = result["judge_calls"]
    assert record["status"] == "judge_error" and record["score"] is None
    assert "busy" in record["error"] and record["latency_s"] >= 0


async def test_a_verdict_reused_from_the_cache_says_no_new_call_was_made() -> None:
    dapo_genrm.clear_verdict_cache()
    judge = MetaJudge("1")
    first = await dapo_genrm.compute_score(Args(), _sample(), client=judge)
    second = await dapo_genrm.compute_score(Args(), _sample(), client=judge)
    assert len(judge.calls) == 1
    assert "cache" not in first["judge_calls"][0]
    assert second["judge_calls"][0]["cache"] == "hit"
    dapo_genrm.clear_verdict_cache()


async def test_a_reward_of_several_calls_records_each() -> None:
    judge = MetaJudge(lambda messages, route_key: "1")
    args = Args(dual_quality_route_key="quality", dual_safety_route_key="safety")
    result = await dual.compute_score(args, _sample(), client=judge)
    assert [r["route_key"] for r in result["judge_calls"]] == ["quality", "safety"]
    assert [r["engine"] for r in result["judge_calls"]] == ["quality/1", "safety/1"]


async def test_a_rubric_and_a_panel_record_every_call() -> None:
    from genrm_rewards import rubric

    judge = MetaJudge("1")
    sample = Sample(
        response="Answer: 42",
        label="42",
        metadata={"question": "6*7?", "rubric": [{"criterion": "right", "weight": 2}, "brief"]},
    )
    graded = await rubric.compute_score(Args(verdict_cache=False), sample, client=judge)
    assert len(graded["judge_calls"]) == 2
    panel = Args(verdict_cache=False, judge_panel="a,b")
    asked = await dapo_genrm.compute_score(panel, _sample(), client=judge)
    assert [r["route_key"] for r in asked["judge_calls"]] == ["a", "b"]


async def test_each_response_of_a_pairwise_group_records_its_comparisons() -> None:
    from genrm_rewards import pairwise

    group = [Sample(response=f"Answer: {a}", label="42", metadata={}) for a in ("42", "41", "40")]
    results = await pairwise.compute_score_batch(Args(), group, client=MetaJudge("1"))
    # all pairs of 3, both orders: 6 calls, each response in 4 of them
    assert [len(r["judge_calls"]) for r in results] == [4, 4, 4]
    assert all(c["engine"] == "__default__/1" for r in results for c in r["judge_calls"])
