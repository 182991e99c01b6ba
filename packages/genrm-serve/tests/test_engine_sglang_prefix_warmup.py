"""The SGLang engine's warm-up and follow decisions, called directly: no SGLang, no engine, no
event loop. What the engine then sends, and when, is ``test_engine_sglang_behaviour.py``'s."""

from __future__ import annotations

from genrm_serve.engines.sglang.prefix_warmup import (
    PREFIX_WARM_MIN_TOKENS,
    WarmupPolicy,
    follow_or_lead,
    plan_warmups,
    prefill_bound,
    run_of_each,
    shared_prefixes,
    warm_waves,
)

POLICY = WarmupPolicy()


def _group(head: int, shared: int, own: list[int]) -> list[list[int]]:
    """Prompts of one group: ``shared`` tokens of ``head``, then each one's own tail."""
    return [[head] * shared + [t, t + 1] for t in own]


def test_warm_waves_split_by_tokens() -> None:
    runs = [[1] * 100, [2] * 100, [3] * 300, [4] * 50]
    assert warm_waves(runs, 250) == [[0, 1], [2], [3]]
    assert warm_waves(runs, None) == warm_waves(runs, 0) == [[0, 1, 2, 3]]
    assert warm_waves([], 250) == warm_waves([], None) == []


def test_each_prompt_joins_the_longest_run_it_starts_with() -> None:
    runs = [[1, 2], [1, 2, 3], [4]]
    prompts = [[1, 2, 3, 9], [1, 2, 8], [4, 4], [5], [1]]
    assert run_of_each(prompts, runs) == [1, 0, 2, None, None]


def test_a_run_is_shared_by_two_prompts_and_long_enough() -> None:
    a, b = _group(7, 80, [100, 200])
    assert shared_prefixes([a, b], 64) == [[7] * 80]
    assert shared_prefixes([a, b], 81) == []  # shorter than the minimum: recomputed
    assert shared_prefixes([a], 64) == []  # one prompt shares with nobody
    c = [8] * 90
    assert shared_prefixes([a, c, b], 64) == [[7] * 80]  # c shares nothing


def test_only_a_prefill_bound_request_is_warmed_up() -> None:
    assert prefill_bound(100, 1, POLICY) and prefill_bound(100, 100, POLICY)
    assert not prefill_bound(100, 101, POLICY)  # a rollout: its decode dwarfs the prompt
    assert prefill_bound(100, 10_000, WarmupPolicy(max_new_per_prompt_token=None))


def test_a_judge_batch_warms_each_group_s_run_and_sends_loners_at_once() -> None:
    g0 = _group(7, 100, [300, 301, 302])
    g1 = _group(9, 120, [400, 401])
    loner = [11] * 90
    # interleaved, as a batch may come: the plan keeps the batch's order within each list
    batch = [g0[0], g1[0], loner, g0[1], g1[1], g0[2]]
    prompts = dict(enumerate(batch))
    plan = plan_warmups(prompts, dict.fromkeys(prompts, 1), POLICY)
    assert plan.runs == [[7] * 100, [9] * 120]
    assert plan.members == [[0, 3, 5], [1, 4]]
    assert plan.at_once == [2]
    assert plan.waves == [[0, 1]]  # one wave of all by default
    waved = plan_warmups(prompts, dict.fromkeys(prompts, 1), WarmupPolicy(wave_tokens=150))
    assert waved.waves == [[0], [1]] and waved.members == plan.members


def test_a_rollout_batch_goes_out_at_once() -> None:
    """Samples of one prompt that each generate more than their prompt: no warm-up; and a
    request refused before SGLang (absent from ``prompts``) is simply not planned."""
    prompts = dict(enumerate(_group(7, 100, [1, 2, 3, 4])))
    del prompts[2]
    plan = plan_warmups(prompts, dict.fromkeys(prompts, 200), POLICY)
    assert plan.at_once == [0, 1, 3] and plan.runs == plan.members == plan.waves == []
    # the same prompts with one-token replies (a judge's) share one run
    judged = plan_warmups(prompts, dict.fromkeys(prompts, 1), POLICY)
    assert judged.members == [[0, 1, 3]] and judged.at_once == []


def test_a_request_follows_the_running_leader_of_its_group() -> None:
    leader, me = _group(7, PREFIX_WARM_MIN_TOKENS, [1, 2])
    assert follow_or_lead(me, leader, POLICY) == "follow"
    # no leader running (none, or done): a long prompt leads its group's later requests
    assert follow_or_lead(me, None, POLICY) == "lead"
    # a leader it shares too little with: it goes out, and leads from now on
    assert follow_or_lead(me, [7] * 10 + [5] * 100, POLICY) == "lead"
    # a short prompt neither follows (it shares fewer than the minimum) nor leads
    short = [7] * (PREFIX_WARM_MIN_TOKENS - 1)
    assert follow_or_lead(short, leader, POLICY) == "alone"
    assert follow_or_lead(short, None, POLICY) == "alone"
