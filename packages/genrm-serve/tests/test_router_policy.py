"""The router's policy on plain data: which engine a request goes to, given the engines' loads
and health and the request's prefix key. No router, no Ray, no event loop."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from genrm_serve.engine_refs import EngineRef
from genrm_serve.router import EngineSlot
from genrm_serve.router.policy import (
    Choice,
    affinity_slack,
    choose_engine,
    home_of,
    serving_home,
)


@dataclass
class Load:
    engine_id: str
    in_flight: int = 0
    healthy: bool = True


def _engines(*in_flight: int) -> list[Load]:
    return [Load(f"q/{i}", n) for i, n in enumerate(in_flight)]


def _choose(
    engines: list[Load],
    n: int = 1,
    *,
    inflight_limit: int = 4,
    exclude: frozenset[str] = frozenset(),
    start: int = 0,
) -> Load | None:
    """The engine chosen for ``n`` requests without a key."""
    choice = choose_engine(
        engines, n, inflight_limit=inflight_limit, slack=2, exclude=exclude, start=start
    )
    return None if choice is None else choice.engine


def _home_and_other(key: str, engines: list[Load]) -> tuple[Load, Load]:
    home = home_of(key, engines)
    assert home is not None
    return home, next(e for e in engines if e is not home)


# ---- load alone ------------------------------------------------------------------------------


def test_the_least_loaded_engine_is_chosen() -> None:
    engines = _engines(3, 1, 2)
    assert _choose(engines) is engines[1]


@pytest.mark.parametrize(("start", "chosen"), [(0, 0), (1, 1), (2, 2), (3, 0)], ids=str)
def test_ties_go_to_the_first_in_turn_from_start(start: int, chosen: int) -> None:
    engines = _engines(1, 1, 1)
    assert _choose(engines, start=start) is engines[chosen]


def test_an_engine_without_room_is_passed_over_unless_it_is_idle() -> None:
    engines = _engines(4, 3)
    assert _choose(engines, inflight_limit=4) is engines[1]
    assert _choose(engines, 2, inflight_limit=4) is None  # 3 + 2 > 4 and 4 + 2 > 4
    idle = _engines(0)
    assert _choose(idle, 9, inflight_limit=4) is idle[0]  # a batch above the limit: idle only


def test_unhealthy_and_excluded_engines_are_never_chosen() -> None:
    engines = _engines(0, 2, 3)
    engines[0].healthy = False
    assert _choose(engines) is engines[1]
    assert _choose(engines, exclude=frozenset({"q/1"})) is engines[2]


@pytest.mark.parametrize(
    "case", ["none", "all unhealthy", "all full", "all excluded"], ids=lambda c: c
)
def test_no_eligible_engine_is_no_choice(case: str) -> None:
    engines = {
        "none": [],
        "all unhealthy": [Load("q/0", healthy=False), Load("q/1", healthy=False)],
        "all full": _engines(4, 4),
        "all excluded": _engines(0, 0),
    }[case]
    exclude = {"q/0", "q/1"} if case == "all excluded" else set()
    assert choose_engine(engines, 1, "g", inflight_limit=4, slack=2, exclude=exclude) is None


def test_without_a_key_the_choice_says_nothing_of_homes() -> None:
    engines = _engines(0)
    assert choose_engine(engines, inflight_limit=4, slack=2) == Choice(engines[0], home=None)


# ---- a key's home ----------------------------------------------------------------------------


def test_a_key_goes_to_its_home_while_the_home_is_within_slack_of_the_least_loaded() -> None:
    engines = _engines(0, 0, 0, 0)
    home, _ = _home_and_other("group-1", engines)
    home.in_flight = 10
    choice = choose_engine(engines, 1, "group-1", inflight_limit=64, slack=10)
    assert choice == Choice(home, home=True)  # 10 <= 0 + 10


def test_a_busy_home_spills_to_the_least_loaded_engine() -> None:
    engines = _engines(0, 0)
    home, other = _home_and_other("g", engines)
    home.in_flight, other.in_flight = 9, 0
    assert choose_engine(engines, 1, "g", inflight_limit=64, slack=8) == Choice(other, home=False)
    other.in_flight = 1  # 9 <= 1 + 8: home again
    assert choose_engine(engines, 1, "g", inflight_limit=64, slack=8) == Choice(home, home=True)


def test_a_full_home_spills_even_within_slack() -> None:
    engines = _engines(0, 0)
    home, other = _home_and_other("g", engines)
    home.in_flight, other.in_flight = 2, 1
    assert choose_engine(engines, 1, "g", inflight_limit=2, slack=8) == Choice(other, home=False)


def test_the_least_loaded_engine_that_is_the_home_counts_as_home() -> None:
    engines = _engines(5, 5)
    home, _ = _home_and_other("g", engines)
    home.in_flight = 0
    assert choose_engine(engines, 1, "g", inflight_limit=8, slack=2) == Choice(home, home=True)


@pytest.mark.parametrize("why", ["unhealthy", "excluded"])
def test_a_home_that_cannot_serve_hands_the_key_to_its_next_ranked_engine(why: str) -> None:
    engines = _engines(0, 0, 0, 0)
    home, _ = _home_and_other("g", engines)
    if why == "unhealthy":
        home.healthy = False
    exclude = {home.engine_id} if why == "excluded" else set()
    others = [e for e in engines if e is not home]
    successor = home_of("g", others)
    assert successor is not None
    choice = choose_engine(engines, 1, "g", inflight_limit=8, slack=2, exclude=exclude)
    assert choice == Choice(successor, home=True)
    assert serving_home("g", engines, exclude) is successor


def test_an_asleep_home_is_still_chosen_it_refuses_and_the_router_fails_over() -> None:
    """Sleep is not a policy input: a probe's word on it can be stale (engines shared by
    replicas), and a sleeping engine's refusal is failed over like any engine failure."""
    slots = [EngineSlot(route_key="q", index=i, ref=EngineRef(), state="healthy") for i in (0, 1)]
    home = home_of("g", slots)
    assert home is not None
    home.asleep = True
    assert choose_engine(slots, 1, "g", inflight_limit=8, slack=2) == Choice(home, home=True)


# ---- rendezvous hashing ----------------------------------------------------------------------


def test_home_of_ranks_only_by_key_and_engine() -> None:
    class E:
        def __init__(self, engine_id: str) -> None:
            self.engine_id = engine_id

    engines = [E(f"q/{i}") for i in range(5)]
    homes = [home_of(f"k{i}", engines) for i in range(50)]
    assert [home_of(f"k{i}", reversed(engines)) for i in range(50)] == homes
    assert home_of("k", []) is None


def test_many_keys_spread_over_every_engine() -> None:
    engines = _engines(0, 0, 0, 0)
    homes = (serving_home(f"group-{i}", engines) for i in range(2000))
    counts = Counter(e.engine_id for e in homes if e is not None)
    assert set(counts) == {e.engine_id for e in engines}
    assert all(400 <= c <= 600 for c in counts.values()), counts  # 500 each, hash noise aside


@pytest.mark.parametrize(("limit", "slack"), [(1, 2), (16, 2), (64, 8), (256, 32)], ids=str)
def test_the_slack_is_an_eighth_of_the_limit_at_least_two(limit: int, slack: int) -> None:
    assert affinity_slack(limit) == slack
