"""Judge panels: one question asked of several route keys, aggregated; quorum and failure rules."""

import pytest
from rewards_doubles import Args, JudgeDouble, Sample, answer_block, prompt_text

from genrm_client import GenRMError, GenRMTimeoutError
from genrm_rewards import RewardConfigError, resolve_args
from genrm_rewards.dapo_genrm import compute_score, compute_score_batch
from genrm_rewards.panel import aggregate_scores, merge_agreement
from genrm_rewards.rubric import compute_score as rubric_score

Reply = str | GenRMError


def panel_judge(members: dict[str, Reply | dict[str, Reply]]) -> JudgeDouble:
    """Judges with known preferences: per route key a reply, or a reply per quoted answer."""

    def script(messages: list[dict[str, str]], route: str | None) -> Reply:
        rule = members[route or ""]
        if isinstance(rule, dict):
            block = answer_block(messages)
            return next(reply for answer, reply in rule.items() if f"| {answer}" in block)
        return rule

    return JudgeDouble(script)


def sample(answer: str = "42") -> Sample:
    return Sample(response=f"Answer: {answer}", label="42", metadata={"question": "6*7?"})


def panel(*members: str, how: str = "mean", quorum: int | None = None) -> Args:
    return Args(
        judge_panel=",".join(members),
        judge_panel_aggregate=how,
        judge_panel_quorum=quorum,
        verdict_cache=False,
    )


@pytest.mark.parametrize(
    ("how", "scores", "expected"),
    [
        ("mean", [1.0, 0.0, 1.0], 2 / 3),
        ("min", [1.0, 0.0, 1.0], 0.0),
        ("majority", [1.0, 0.0, 1.0], 1.0),
        ("majority", [0.0, 0.0, 1.0], 0.0),
        ("majority", [1.0, 0.0], 0.5),  # an even panel split in two: no majority
        ("unanimity", [1.0, 1.0, 1.0], 1.0),
        ("unanimity", [1.0, 1.0, 0.0], 0.0),
        ("unanimity", [0.9, 0.6], 1.0),  # logprob verdicts vote by P("1") >= 0.5
        ("mean", [0.9, 0.6], 0.75),
    ],
)
def test_aggregates(how: str, scores: list[float], expected: float) -> None:
    assert aggregate_scores(scores, how) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("how", "score"), [("mean", 2 / 3), ("majority", 1.0), ("min", 0.0), ("unanimity", 0.0)]
)
async def test_every_member_is_asked_and_the_verdicts_aggregated(how: str, score: float) -> None:
    judge = panel_judge({"a": "1", "b": "0", "c": "1"})
    result = await compute_score(panel("a", "b", "c", how=how), sample(), client=judge)
    assert result["status"] == "ok" and result["score"] == pytest.approx(score)
    assert sorted(route for _, route, _ in judge.calls) == ["a", "b", "c"]
    assert len({prompt_text(m) for m, _, _ in judge.calls}) == 1  # the same question
    assert len(set(judge.prefix_keys)) == 1  # and the same affinity key
    report = result["details"]["panel"]
    assert report["members"]["b"] == {"score": 0.0, "status": "ok", "pred": "0"}
    assert report["aggregate"] == how and report["quorum"] is None
    assert report["agreement"] == {"a~b": [0, 1], "a~c": [1, 1], "b~c": [0, 1]}


async def test_without_a_quorum_one_failed_member_is_a_judge_error_never_0() -> None:
    judge = panel_judge({"a": "1", "b": GenRMTimeoutError("slow"), "c": "1"})
    result = await compute_score(panel("a", "b", "c"), sample(), client=judge)
    assert result["status"] == "judge_error" and result["score"] is None
    assert "2 of 3 members answered (no quorum)" in result["error"]
    assert "b: GenRMTimeoutError" in result["error"]
    assert result["details"]["panel"]["members"]["b"]["status"] == "judge_error"
    # the members that answered still count for agreement
    assert result["details"]["panel"]["agreement"] == {"a~c": [1, 1]}


@pytest.mark.parametrize(
    ("quorum", "failing", "status", "score"),
    [
        (2, ["b"], "ok", 1.0),  # b left out, a and c agree
        (2, ["b", "c"], "judge_error", None),  # only a answered: under quorum
        (1, ["b", "c"], "ok", 1.0),
        (3, ["c"], "judge_error", None),
        (2, [], "ok", 2 / 3),  # nobody failed: all three count
    ],
)
async def test_quorum_leaves_failed_members_out(
    quorum: int, failing: list[str], status: str, score: float | None
) -> None:
    replies: dict[str, Reply | dict[str, Reply]] = {"a": "1", "b": "0", "c": "1"}
    for member in failing:
        replies[member] = GenRMError("down")
    result = await compute_score(
        panel("a", "b", "c", quorum=quorum), sample(), client=panel_judge(replies)
    )
    assert result["status"] == status
    assert result["score"] == (None if score is None else pytest.approx(score))


async def test_every_member_failing_is_a_judge_error_even_with_a_quorum() -> None:
    judge = panel_judge({"a": GenRMError("down"), "b": GenRMError("down")})
    result = await compute_score(panel("a", "b", quorum=1), sample(), client=judge)
    assert result["status"] == "judge_error" and result["score"] is None


async def test_an_unparsed_member_votes_0_and_marks_the_aggregate() -> None:
    judge = panel_judge({"a": "1", "b": "Yes"})
    result = await compute_score(panel("a", "b"), sample(), client=judge)
    assert result["status"] == "unparsed" and result["score"] == 0.5


async def test_a_group_is_one_generate_batch_per_member_with_the_cache_per_member() -> None:
    judge = panel_judge({"a": {"42": "1", "41": "0"}, "b": {"42": "1", "41": "1"}})
    args = Args(judge_panel="a,b")  # verdict cache on
    group = [sample("42"), sample("41"), sample("42")]
    results = await compute_score_batch(args, group, client=judge)
    assert [r["score"] for r in results] == [1.0, 0.5, 1.0]
    assert judge.batch_calls == 2 and len(judge.calls) == 4  # two distinct answers × two members
    assert [r["cache"] for r in results] == ["miss", "miss", "hit"]
    again = await compute_score(args, sample("41"), client=judge)
    assert again["score"] == 0.5 and again["cache"] == "hit" and len(judge.calls) == 4
    agreement = merge_agreement(r["details"]["panel"]["agreement"] for r in results)
    assert agreement == {"a~b": [2, 3]}


async def test_the_rule_gate_decides_before_the_panel() -> None:
    judge = panel_judge({"a": "0", "b": "0"})
    result = await compute_score(
        Args(judge_panel="a,b", rule_gate=True), sample("42"), client=judge
    )
    assert result["gate"] == "hit" and result["score"] == 1.0 and judge.calls == []


async def test_a_rubric_asks_each_criterion_of_each_member() -> None:
    rubric = [{"criterion": "Is right", "weight": 2}, {"criterion": "Is short", "weight": 1}]

    def script(messages: list[dict[str, str]], route: str | None) -> Reply:
        short = "Is short" in prompt_text(messages).split("[Criterion]:")[1]
        if route == "strict":
            return "0" if short else "1"
        return GenRMError("down") if short else "1"

    s = Sample("Answer: 42", label="42", metadata={"question": "6*7?", "rubric": rubric})
    judge = JudgeDouble(script)
    result = await rubric_score(
        Args(judge_panel="strict,kind", judge_panel_quorum=1), s, client=judge
    )
    assert judge.batch_calls == 1 and len(judge.calls) == 4
    assert len(set(judge.prefix_keys)) == 1
    assert result["status"] == "ok" and result["score"] == pytest.approx(2 / 3)
    short = result["details"]["criteria"][1]
    assert short["panel"]["kind"]["status"] == "judge_error" and short["score"] == 0.0
    assert result["details"]["panel"]["agreement"] == {"strict~kind": [1, 1]}
    failed = await rubric_score(Args(judge_panel="strict,kind"), s, client=JudgeDouble(script))
    assert failed["status"] == "judge_error" and failed["score"] is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"judge_panel": "a"}, r"two or more route keys"),
        ({"judge_panel": "a,a"}, r"each route key once"),
        ({"judge_panel": "a,"}, r"two or more route keys"),
        ({"judge_panel_quorum": 1}, r"judge_panel_quorum=1 needs a judge_panel"),
        ({"judge_panel": "a,b", "judge_panel_quorum": 3}, r"more than the 2 members"),
        ({"judge_panel": "a,b", "genrm_route_key": "c"}, r"set one"),
        ({"judge_panel": "a,b", "judge_panel_aggregate": "vote"}, r"judge_panel_aggregate"),
    ],
)
def test_bad_panel_settings_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(RewardConfigError, match=message):
        resolve_args(Args(**settings))


def test_panel_members_from_a_json_list() -> None:
    assert resolve_args(Args(judge_panel='["a", "b"]')).judge_panel == ("a", "b")
    assert resolve_args(Args(judge_panel=" a , b ")).judge_panel == ("a", "b")
