"""pairwise-genrm against the real judge service: Ray Serve, HTTP on loopback, the real client.

The instances run genrm-serve's scripted test engine as pairwise judges with known preferences
(``prefer``: a response ranks by the best of "best", "good", "fair", "poor" it says): a fair
one, one that gives Response A a rank for free (a first-position bias), one that fails every
comparison quoting "boom", and one too slow for any deadline. Everything between the reward
and the engine is the production path.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("genrm_serve.app", reason="genrm-serve's Serve app is not installed")

from rewards_doubles import Args, Sample

from genrm_client import AsyncGenRMClient
from genrm_rewards import get_batch_reward_fn
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import scripted_model_path

pytestmark = pytest.mark.timeout(120)

RANKS = ["best", "good", "fair", "poor"]


def _script(**kw: Any) -> str:
    return scripted_model_path(default="?", prefer=RANKS, **kw)


@dataclass
class GroupSample(Sample):
    group_id: int = 0


def group(*words: str, gid: int = 0) -> list[GroupSample]:
    return [
        GroupSample(response=f"A {w} answer.", label="42", metadata={"question": f"Q{gid}"})
        for w in words
    ]


@pytest.fixture(scope="module")
def service(serve_port: int) -> Iterator[ServeArgs]:
    instances = build_instances(
        instances={
            "fair": {"model_path": _script(), "num_gpus": 1},
            "biased": {"model_path": _script(first_bias=1), "num_gpus": 1},
            # one request per engine batch: a failure takes no other comparison along
            "flaky": {
                "model_path": _script(fail_when_contains="boom"),
                "num_gpus": 1,
                "engine_config": {"max_batch_size": 1},
            },
            "slow": {"model_path": _script(delay_s=30.0), "num_gpus": 1},
        },
        engine="scripted",
    )
    args = ServeArgs(
        port=serve_port,
        app_name="pairwise-it",
        api_key=None,
        engine_num_cpus=0.05,
        health_check_period_s=0.5,
        probe_timeout_s=5.0,
    )
    deploy(build_app(instances, args=args), args)
    wait_until_healthy(args, 120)
    yield args


@pytest.fixture
async def client(service: ServeArgs) -> AsyncIterator[AsyncGenRMClient]:
    judge = AsyncGenRMClient(base_url=service.url, timeout=60.0, max_retries=0)
    try:
        yield judge
    finally:
        await judge.aclose()


async def rank(client: AsyncGenRMClient, samples: list[GroupSample], **args: Any) -> list[Any]:
    fn = get_batch_reward_fn("pairwise-genrm")
    return list(await fn(Args(**args), samples, client=client))  # type: ignore[call-arg]


def flip_share(results: list[Any]) -> float:
    parts = [r["details"]["pairwise"] for r in results]
    return sum(p["flipped_pairs"] for p in parts) / sum(p["both_order_pairs"] for p in parts)


async def test_a_fair_judge_ranks_the_group(client: AsyncGenRMClient) -> None:
    results = await rank(client, group("poor", "best", "fair", "good"), genrm_route_key="fair")
    assert [r["score"] for r in results] == [0.0, 1.0, 1 / 3, 2 / 3]
    assert all(r["status"] == "ok" and r["route_key"] == "fair" for r in results)
    assert flip_share(results) == 0.0


async def test_the_order_swap_cancels_the_position_bias(client: AsyncGenRMClient) -> None:
    words = ("poor", "fair", "good", "best")
    once = await rank(client, group(*words), genrm_route_key="biased", pairwise_both_orders=False)
    once_reversed = await rank(
        client, group(*words[::-1]), genrm_route_key="biased", pairwise_both_orders=False
    )
    # asked once, "best" scores differently by where it sits: the position decides
    assert once[-1]["score"] != once_reversed[0]["score"]
    both = await rank(client, group(*words), genrm_route_key="biased")
    both_reversed = await rank(client, group(*words[::-1]), genrm_route_key="biased")
    scores = [r["score"] for r in both]
    assert scores == [1 / 6, 2 / 6, 4 / 6, 5 / 6]  # ranked by quality
    assert [r["score"] for r in both_reversed] == scores[::-1]  # wherever a response sits
    assert flip_share(both) == 0.5  # the three pairs one rank apart flipped


async def test_failed_comparisons_are_dropped_never_zero(client: AsyncGenRMClient) -> None:
    results = await rank(client, group("good", "boom", "poor"), genrm_route_key="flaky")
    broken = results[1]
    assert broken["status"] == "judge_error" and broken["score"] is None
    assert broken["details"]["pairwise"]["failed"] == 4
    assert "boom" in broken["error"]
    assert [r["score"] for r in (results[0], results[2])] == [1.0, 0.0]


async def test_a_slow_judge_past_the_deadline_is_judge_timeout(client: AsyncGenRMClient) -> None:
    began = time.monotonic()
    results = await rank(
        client, group("good", "poor", "fair"), genrm_route_key="slow", group_judge_deadline_s=1.0
    )
    assert time.monotonic() - began < 10  # stopped at the deadline, not after 30 s
    assert [r["status"] for r in results] == ["judge_timeout"] * 3
    assert all(r["score"] is None for r in results)  # never 0


async def test_a_round_robin_of_8_in_one_call(client: AsyncGenRMClient) -> None:
    words = ["best", "good", "fair", "poor"] * 2
    results = await rank(
        client,
        group(*words),
        genrm_route_key="fair",
        pairwise_pairing="round-robin",
        pairwise_rounds=3,
    )
    assert all(r["details"]["pairwise"]["comparisons"] == 6 for r in results)
    assert all(len(r["details"]["pairwise"]["opponents"]) == 3 for r in results)
    best, poor = results[0]["score"], results[3]["score"]
    assert best is not None and poor is not None and best > poor
