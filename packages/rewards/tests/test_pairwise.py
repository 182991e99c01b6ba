"""pairwise-genrm against test doubles: judges with known preferences, a position bias that the
order swap cancels, failures on demand, the deadline, and scores that are never a silent 0."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from rewards_doubles import (
    Args,
    JudgeDouble,
    Sample,
    pairwise_responses,
    preferring,
    prompt_text,
)

from genrm_rewards import get_batch_reward_fn, get_reward_fn, is_group_level
from genrm_rewards.defer import score_deferred
from genrm_rewards.errors import RewardConfigError
from genrm_rewards.pairwise import (
    Comparison,
    bradley_terry,
    compute_score,
    compute_score_batch,
    max_rounds,
    pairs_of,
    round_robin,
    win_rates,
)


@dataclass
class GroupSample(Sample):
    """A sample of rl-core's shape: it knows its group."""

    group_id: int = 0


def group(values: list[int], *, gid: int = 0, label: str | None = "42") -> list[GroupSample]:
    """Responses whose quality is the number they end with (the judges below read it)."""
    return [
        GroupSample(
            response=f"My answer: {v}",
            label=label,
            prompt="Write something good.",
            metadata={"question": f"Question {gid}"},
            group_id=gid,
        )
        for v in values
    ]


def number(text: str) -> float:
    return float(text.rsplit(" ", 1)[1])


def scores(results: list[Any]) -> list[float | None]:
    return [r["score"] for r in results]


def flip_share(results: list[Any]) -> float:
    flipped = sum(r["details"]["pairwise"]["flipped_pairs"] for r in results)
    pairs = sum(r["details"]["pairwise"]["both_order_pairs"] for r in results)
    return flipped / pairs


def test_registered_as_a_group_reward() -> None:
    assert is_group_level("pairwise-genrm") and not is_group_level("dapo-genrm")
    assert get_batch_reward_fn("pairwise-genrm") is compute_score_batch
    assert get_reward_fn("pairwise-genrm") is compute_score


async def test_per_sample_call_is_refused() -> None:
    with pytest.raises(RewardConfigError, match="compares the responses of a group"):
        await compute_score(Args(), group([1])[0], client=JudgeDouble())


# --- pairing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 8, 9, 16])
def test_full_round_robin_meets_every_pair_once(n: int) -> None:
    pairs = round_robin(n, max_rounds(n))
    assert sorted(pairs) == pairs_of(n, "all", 0)


def test_round_robin_rounds_meet_new_opponents() -> None:
    pairs = round_robin(16, 3)
    assert len(pairs) == len(set(pairs)) == 3 * 8  # 24 pairs instead of 120
    met = Counter(i for p in pairs for i in p)
    assert set(met.values()) == {3}  # every response plays once per round
    with pytest.raises(RewardConfigError, match=r"pairwise_rounds=16 .* has 15 rounds"):
        round_robin(16, 16)


async def test_round_robin_group_of_8_costs_rounds_times_pairs() -> None:
    judge = JudgeDouble(preferring(number))
    args = Args(pairwise_pairing="round-robin", pairwise_rounds=2)
    results = await compute_score_batch(args, group(list(range(8))), client=judge)
    assert len(judge.calls) == 2 * 4 * 2  # 2 rounds x 4 pairs x both orders
    assert judge.batch_calls == 1  # the group in one generate_batch
    assert all(r["details"]["pairwise"]["comparisons"] == 4 for r in results)


# --- known preferences and the position bias -----------------------------------------------------


async def test_known_preferences_rank_the_group() -> None:
    values = [3, 1, 4, 0, 2]
    results = await compute_score_batch(
        Args(), group(values), client=JudgeDouble(preferring(number))
    )
    # all pairs, both orders: each response won against exactly the lower ones
    assert scores(results) == [v / 4 for v in values]
    assert [r["status"] for r in results] == ["ok"] * 5
    assert flip_share(results) == 0.0
    first = results[0]
    assert first["pred"] == "won 6 of 8" and first["acc"] == 1
    assert first["details"]["pairwise"]["opponents"] == [1, 2, 3, 4]


async def test_order_swap_cancels_a_first_position_bias() -> None:
    """A judge that always answers "A" decides the ranking by position alone when each pair is
    asked once; asked in both orders, every pair flips and nobody gains from the bias."""
    always_a = JudgeDouble("1")
    once = await compute_score_batch(
        Args(pairwise_both_orders=False), group([5, 5, 5, 5]), client=always_a
    )
    assert scores(once) == [1.0, 2 / 3, 1 / 3, 0.0]  # equal responses, ranked by position
    both = await compute_score_batch(Args(), group([5, 5, 5, 5]), client=JudgeDouble("1"))
    assert scores(both) == [0.5] * 4
    assert flip_share(both) == 1.0


async def test_biased_judge_with_real_preferences_keeps_the_ranking() -> None:
    """The judge prefers A unless B is better by more than 1.5: close pairs follow the
    position. With both orders those pairs flip (and count as a tie), the clear ones decide."""
    values = [0, 1, 2, 3, 4, 5]
    biased = preferring(number, first_bias=1.5)
    once = await compute_score_batch(
        Args(pairwise_both_orders=False), group(values[::-1]), client=JudgeDouble(biased)
    )
    reversed_once = await compute_score_batch(
        Args(pairwise_both_orders=False), group(values), client=JudgeDouble(biased)
    )
    # asked once, the same response scores differently depending on where it sits
    assert once[0]["score"] != reversed_once[-1]["score"]
    both = await compute_score_batch(Args(), group(values), client=JudgeDouble(biased))
    s = scores(both)
    assert s == sorted(s) and s[0] < s[-1]  # still ranked by quality
    both_reversed = await compute_score_batch(
        Args(), group(values[::-1]), client=JudgeDouble(biased)
    )
    assert scores(both_reversed) == s[::-1]  # and the position no longer matters
    assert 0 < flip_share(both) < 1  # the close pairs (differing by 1) flipped


async def test_bradley_terry_option() -> None:
    values = [3, 1, 4, 0, 2]
    results = await compute_score_batch(
        Args(pairwise_score="bradley_terry"), group(values), client=JudgeDouble(preferring(number))
    )
    s = [float(x) for x in scores(results) if x is not None]
    assert [sorted(values).index(v) for v in values] == [sorted(s).index(x) for x in s]
    assert all(0.0 < x < 1.0 for x in s)
    assert results[0]["details"]["pairwise"]["score_rule"] == "bradley_terry"


def test_bradley_terry_symmetry_and_soft_outcomes() -> None:
    ties = [Comparison(0, 1, "ok", 0.5), Comparison(1, 2, "ok", 0.5), Comparison(2, 0, "ok", 0.5)]
    assert bradley_terry(3, ties) == pytest.approx([0.5, 0.5, 0.5])
    soft = [Comparison(0, 1, "ok", 0.8), Comparison(1, 0, "ok", 0.3)]
    assert win_rates(2, soft) == pytest.approx([0.75, 0.25])
    strong, weak = bradley_terry(2, soft)
    assert strong is not None and weak is not None and strong > 0.5 > weak
    assert bradley_terry(3, soft)[2] is None  # never compared: no score


# --- the prompt: shared prefix, with or without a reference ---------------------------------------


async def test_prompt_puts_question_and_reference_first_and_shares_the_prefix() -> None:
    judge = JudgeDouble(preferring(number))
    batch = group([1, 2, 3], gid=0) + group([4, 5], gid=1, label=None)
    results = await compute_score_batch(Args(), batch, client=judge)
    assert scores(results) == [0.0, 0.5, 1.0, 0.0, 1.0]  # two groups, each ranked on its own
    keys = Counter(judge.prefix_keys)
    assert sorted(keys.values()) == [2, 6]  # one affinity key per group
    first, other = (prompt_text(m) for m, _, _ in (judge.calls[0], judge.calls[-1]))
    head = first[: first.index("[Response A]")]
    assert "Question 0" in head and "[Reference Answer]:\n42" in head
    assert all(prompt_text(m).startswith(head) for m, _, _ in judge.calls[:6])
    assert "Question 1" in other and "[Reference Answer]" not in other  # no label: no reference
    assert pairwise_responses(judge.calls[0][0]) == ("My answer: 1", "My answer: 2")


# --- failures: dropped, never a 0 ----------------------------------------------------------------


async def test_failed_comparisons_are_dropped_and_too_few_is_judge_error() -> None:
    batch = group([1, 2, 3, 4])
    batch[3].response = "fail-me 9"
    judge = JudgeDouble(preferring(number, fail_when="fail-me"))
    results = await compute_score_batch(Args(), batch, client=judge)
    broken = results[3]
    assert broken["status"] == "judge_error" and broken["score"] is None  # never 0
    assert broken["details"]["pairwise"]["failed"] == 6
    assert "GenRMTimeoutError" in broken["error"]
    # the others keep the comparisons among themselves (4 each), the failed ones dropped
    assert scores(results[:3]) == [0.0, 0.5, 1.0]
    assert all(r["details"]["pairwise"]["comparisons"] == 4 for r in results[:3])


async def test_min_comparisons_turns_a_thin_response_into_judge_error() -> None:
    batch = group([1, 2, 3])
    batch[2].response = "fail-me 3"
    judge = JudgeDouble(preferring(number, fail_when="fail-me"))
    # response 0 and 1 keep 2 comparisons each (their pair in both orders): not 3
    results = await compute_score_batch(Args(pairwise_min_comparisons=3), batch, client=judge)
    assert [r["status"] for r in results] == ["judge_error"] * 3
    assert all(r["score"] is None for r in results)
    assert "fewer than pairwise_min_comparisons=3" in results[0]["error"]


async def test_unparsed_verdicts_are_dropped_not_zero() -> None:
    results = await compute_score_batch(Args(), group([1, 2]), client=JudgeDouble("maybe"))
    assert [r["status"] for r in results] == ["judge_error", "judge_error"]
    assert results[0]["details"]["pairwise"]["unparsed"] == 2


async def test_a_group_of_one_has_nothing_to_compare() -> None:
    (result,) = await compute_score_batch(Args(), group([1]), client=JudgeDouble())
    assert result["status"] == "judge_error" and result["score"] is None
    assert "no other response" in result["error"]


# --- the group's deadline -------------------------------------------------------------------------


class SlowOnSome(JudgeDouble):
    """Answers at once, except a comparison quoting ``slow``: it takes ``slow_s``."""

    def __init__(self, script: Any, slow: str, slow_s: float) -> None:
        super().__init__(script)
        self.slow, self.slow_s = slow, slow_s
        self.cancelled = 0

    async def generate(self, messages: Any, *a: Any, **k: Any) -> str:
        if self.slow in prompt_text(messages):
            try:
                await asyncio.sleep(self.slow_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().generate(messages, *a, **k)


async def test_deadline_leaves_the_slow_comparisons_out_as_judge_timeout() -> None:
    batch = group([1, 2, 3, 4])
    batch[3].response = "slow 9"
    judge = SlowOnSome(preferring(number), "slow", 30.0)
    loop = asyncio.get_running_loop()
    began = loop.time()
    results = await compute_score_batch(Args(group_judge_deadline_s=0.3), batch, client=judge)
    assert loop.time() - began < 5  # the group stopped at its deadline, not after 30 s
    slow = results[3]
    assert slow["status"] == "judge_timeout" and slow["score"] is None  # never 0
    assert slow["details"]["pairwise"]["timed_out"] == 6
    assert "6 past the deadline" in slow["error"]
    assert judge.cancelled == 6  # the abandoned requests were cancelled, not left running
    assert scores(results[:3]) == [0.0, 0.5, 1.0]  # judged in time: scored as usual


async def test_no_deadline_uses_one_batch_and_waits() -> None:
    judge = JudgeDouble(preferring(number), delay_s=0.05)
    results = await compute_score_batch(Args(), group([1, 2, 3]), client=judge)
    assert judge.batch_calls == 1 and all(r["status"] == "ok" for r in results)


# --- defer mode ---------------------------------------------------------------------------------


async def test_defer_mode_scores_each_group_of_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import genrm_rewards.judge as judge_module

    judge = JudgeDouble(preferring(number))
    monkeypatch.setattr(judge_module, "default_client", lambda: judge)
    batch = group([2, 1], gid=0) + group([7, 9, 8], gid=1)
    results = await score_deferred(Args(deferred_rm_type="pairwise-genrm"), batch)
    assert scores(results) == [1.0, 0.0, 0.0, 1.0, 0.5]
    assert len(judge.calls) == 2 + 6  # pairs within a group only


@pytest.mark.parametrize("n", [2, 3, 7, 8])
@pytest.mark.parametrize("rounds", [1, 2, 3])
def test_guaranteed_comparisons_is_what_the_pairing_gives(n: int, rounds: int) -> None:
    from genrm_rewards.pairwise import guaranteed_comparisons

    for pairing in ("all", "round-robin"):
        pairs = pairs_of(n, pairing, min(rounds, max_rounds(n)))  # type: ignore[arg-type]
        met = Counter(i for p in pairs for i in p)
        least = min(met.get(i, 0) for i in range(n))
        assert guaranteed_comparisons(n, pairing, rounds, True) == 2 * least  # type: ignore[arg-type]
        assert guaranteed_comparisons(n, pairing, rounds, False) == least  # type: ignore[arg-type]


async def test_readme_worked_example() -> None:
    """The rewards README's pairwise-genrm example: three responses, all pairs, both orders,
    a judge that prefers the better response but leans to the first one on a close call."""
    quality = {"Rayleigh": 2, "Sunlight": 1, "It reflects": 0}

    def judged(text: str) -> float:
        return next(v for k, v in quality.items() if text.startswith(k))

    group = [
        GroupSample(
            prompt="Why is the sky blue?",
            label=None,
            response="Rayleigh scattering: air scatters short (blue) wavelengths most.",
        ),
        GroupSample(prompt="Why is the sky blue?", label=None, response="Sunlight scatters."),
        GroupSample(prompt="Why is the sky blue?", label=None, response="It reflects the sea."),
    ]
    rank = get_batch_reward_fn("pairwise-genrm")
    judge = JudgeDouble(preferring(judged, first_bias=1.0))
    results = await rank(Args(), group, client=judge)  # type: ignore[call-arg]
    assert len(judge.calls) == 6
    assert [r["score"] for r in results] == [0.75, 0.5, 0.25]
    first = dict(results[0])
    assert len(first.pop("judge_calls")) == 4  # its four comparisons' records
    assert first == {
        "score": 0.75,
        "acc": 1,
        "pred": "won 3 of 4",
        "status": "ok",
        "route_key": None,
        "details": {
            "pairwise": {
                "comparisons": 4,
                "wins": 3.0,
                "failed": 0,
                "unparsed": 0,
                "timed_out": 0,
                "opponents": [1, 2],
                "both_order_pairs": 2,
                "flipped_pairs": 1,
                "score_rule": "win_rate",
                "group_size": 3,
            }
        },
    }
    assert flip_share(results) == pytest.approx(2 / 3)  # rl-core: rollout/pairwise_flip_share
