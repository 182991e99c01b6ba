"""The reward functions against the real judge service: Ray Serve, HTTP on loopback, real client.

The instances of the first app run genrm-serve's scripted *test engine* (deterministic replies
chosen by a substring of the prompt), so verdicts can be asserted; everything between the reward
function and the engine is the production path: ``AsyncGenRMClient`` → Serve proxy → ingress →
instance router → engine actor. A second app on the same Serve runs the embedded Gemma 3 270M
behind the hf engine for one end-to-end test with a real model (no verdict asserted).

Script keys are lines of the quoted answer block (``| 42``), so a reply depends on the model
answer only and the test shows that the answer travelled inside its block.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

pytest.importorskip("genrm_serve.app", reason="genrm-serve's Serve app is not installed")

from rewards_doubles import Args, Sample

from genrm_client import AsyncGenRMClient, close_genrm_clients
from genrm_rewards import dapo_genrm, get_batch_reward_fn, get_reward_fn
from genrm_rewards.dapo_genrm import compute_score, compute_score_batch
from genrm_serve.app import build_app, deploy, wait_until_healthy
from genrm_serve.config import build_instances
from genrm_serve.serve_args import ServeArgs
from genrm_serve.testing import free_port, scripted_model_path

pytestmark = pytest.mark.timeout(120)


DEFAULT_SCRIPT = scripted_model_path(
    default="0",
    replies={
        "| 42": "1",
        "| 41": "0",
        "| yes-please": "Yes.",
        "| cut-thinking": "<think>the answers look",
        "| thinks-then-1": "<think>6*7=42, same</think>1",
    },
    fail_when_contains="| boom",
)


@pytest.fixture(scope="module")
def service(serve_port: int) -> Iterator[ServeArgs]:
    instances = build_instances(
        instances={
            "__default__": {
                "model_path": DEFAULT_SCRIPT,
                "num_gpus": 1,
                # the scripted engine counts whitespace-separated words as tokens
                "engine_config": {"max_context_len": 1000},
            },
            "quality": {"model_path": scripted_model_path(default="1"), "num_gpus": 1},
            "safety": {
                "model_path": scripted_model_path(
                    default="1", replies={"how to build a bomb": "0", "| rm -rf": "0"}
                ),
                "num_gpus": 1,
            },
        },
        engine="scripted",
    )
    args = ServeArgs(
        port=serve_port,
        app_name="rewards-it",
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
    judge = AsyncGenRMClient(base_url=service.url, timeout=30.0, max_retries=1)
    try:
        yield judge
    finally:
        await judge.aclose()


def sample(answer: str, label: str = "42") -> Sample:
    return Sample(response=f"Let me compute. Answer: {answer}", label=label)


@pytest.mark.parametrize(
    ("answer", "score", "status"),
    [
        ("42", 1.0, "ok"),
        ("41", 0.0, "ok"),
        ("yes-please", 0.0, "unparsed"),
        ("cut-thinking", 0.0, "unparsed"),
        ("thinks-then-1", 1.0, "ok"),
    ],
)
async def test_dapo_genrm_verdicts(
    client: AsyncGenRMClient, answer: str, score: float, status: str
) -> None:
    result = await dapo_genrm.compute_score(Args(), sample(answer), client=client)
    assert (result["score"], result["status"]) == (score, status)


async def test_default_singleton_client_from_env(
    service: ServeArgs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GENRM_URL", service.url)
    await close_genrm_clients()
    try:
        result = await get_reward_fn("dapo-genrm")(Args(), sample("42"))
    finally:
        await close_genrm_clients()
    assert (result["score"], result["status"]) == (1.0, "ok")


async def test_group_scored_in_one_batch(client: AsyncGenRMClient) -> None:
    group = [sample(a) for a in ["42", "41", "42", "$42$", "42 ", "41", "yes-please", "40"]]
    results = await get_batch_reward_fn("dapo-genrm")(Args(), group, client=client)  # type: ignore[call-arg]
    assert [r["status"] for r in results] == ["ok"] * 6 + ["unparsed", "ok"]
    assert [r["score"] for r in results] == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert [r["cache"] for r in results].count("miss") == 4  # 42, 41, yes-please, 40


async def test_batch_item_failure_stays_with_its_samples(client: AsyncGenRMClient) -> None:
    """One request the service rejects (prompt too long: 413) fails alone, never as a 0."""
    too_long = " ".join(["word"] * 1200)
    group = [sample("42"), sample(too_long), sample("41"), sample(too_long)]
    args = Args(max_answer_chars=20000)
    results = await get_batch_reward_fn("dapo-genrm")(args, group, client=client)  # type: ignore[call-arg]
    assert [(r["status"], r["score"]) for r in results] == [
        ("ok", 1.0), ("judge_error", None), ("ok", 0.0), ("judge_error", None),
    ]  # fmt: skip
    assert "GenRMHTTPError" in results[1]["error"]
    assert "prompt_too_long" in results[1]["error"]


async def test_engine_failure_in_a_batch_is_never_a_zero(client: AsyncGenRMClient) -> None:
    """An engine that fails takes its whole micro-batch down: those samples are judge_error."""
    group = [sample("boom"), sample("42"), sample("41")]
    results = await get_batch_reward_fn("dapo-genrm")(Args(), group, client=client)  # type: ignore[call-arg]
    assert (results[0]["status"], results[0]["score"]) == ("judge_error", None)
    for r, right in zip(results[1:], [1.0, 0.0], strict=True):
        assert (r["status"], r["score"]) in {("judge_error", None), ("ok", right)}


async def test_engine_failure_is_judge_error_not_zero(client: AsyncGenRMClient) -> None:
    result = await dapo_genrm.compute_score(Args(), sample("boom"), client=client)
    assert (result["status"], result["score"]) == ("judge_error", None)
    assert result["error"]


async def test_unknown_route_key_is_judge_error_naming_it(client: AsyncGenRMClient) -> None:
    args = Args(genrm_route_key="no-such-judge")
    result = await dapo_genrm.compute_score(args, sample("42"), client=client)
    assert (result["status"], result["score"]) == ("judge_error", None)
    assert "No GenRM instance registered for route_key=no-such-judge" in result["error"]


async def test_outage_yields_judge_error_for_every_sample() -> None:
    """Nothing listens on the port: after the client's retries every sample is judge_error."""
    down = AsyncGenRMClient(
        base_url=f"http://127.0.0.1:{free_port()}/genrm", timeout=5.0, max_retries=1
    )
    try:
        one = await dapo_genrm.compute_score(Args(), sample("42"), client=down)
        group = await dapo_genrm.compute_score_batch(
            Args(), [sample("42"), sample("41")], client=down
        )
    finally:
        await down.aclose()
    assert (one["status"], one["score"]) == ("judge_error", None)
    assert "GenRMConnectionError" in one["error"]
    assert [(r["status"], r["score"]) for r in group] == [("judge_error", None)] * 2
    assert len(dapo_genrm.verdict_cache()) == 0


async def test_dual_judges(client: AsyncGenRMClient) -> None:
    fn = get_reward_fn("dual-genrm")
    safe = await fn(Args(), sample("42"), client=client)  # type: ignore[call-arg]
    unsafe = Sample(response="Sure, here is how to build a bomb", prompt="help me")
    bad = await fn(Args(), unsafe, client=client)  # type: ignore[call-arg]
    assert (safe["score"], safe["status"]) == (1.0, "ok")
    assert (bad["score"], bad["status"]) == (0.0, "ok")
    assert bad["details"]["safety"]["score"] == 0.0
    assert bad["details"]["quality"]["score"] == 1.0


async def test_agentic_judges(client: AsyncGenRMClient) -> None:
    steps = [
        {"module": "plan", "output": "list the files, then clean up"},
        {"module": "tool_call", "input": "shell", "output": "rm -rf /"},
    ]
    args = Args(
        # two instances stand in for a planner judge and a tool-call judge
        agentic_route_keys={"plan": "quality", "tool_call": "safety"},
        agentic_aggregation="min",
    )
    s = Sample(response="", metadata={"question": "tidy the repo", "trajectory_steps": steps})
    result = await get_reward_fn("agentic-genrm")(args, s, client=client)  # type: ignore[call-arg]
    assert (result["score"], result["status"]) == (0.0, "ok")
    assert [st["score"] for st in result["details"]["steps"]] == [1.0, 0.0]


async def test_a_judge_panel_through_the_service(client: AsyncGenRMClient) -> None:
    """dapo-genrm asked of two instances: __default__ follows the answer, quality says 1."""
    args = Args(judge_panel="__default__,quality", verdict_cache=False)
    results = await compute_score_batch(args, [sample("42"), sample("41")], client=client)
    assert [(r["score"], r["status"]) for r in results] == [(1.0, "ok"), (0.5, "ok")]
    assert results[1]["details"]["panel"]["agreement"] == {"__default__~quality": [0, 1]}
    down = await compute_score(
        Args(judge_panel="__default__,nope", judge_panel_quorum=1, verdict_cache=False),
        sample("42"),
        client=client,
    )
    assert (down["score"], down["status"]) == (1.0, "ok")  # the unknown member is left out
    assert "nope" in down["details"]["panel"]["members"]["nope"]["error"]


async def test_rubric_through_the_service(client: AsyncGenRMClient) -> None:
    rubric = [{"criterion": "Is safe", "weight": 3}, {"criterion": "Is right", "weight": 1}]
    fn = get_reward_fn("rubric-genrm")
    meta = {"question": "tidy the repo", "rubric": rubric}
    safe = await fn(Args(genrm_route_key="safety"), Sample("ls", metadata=meta), client=client)  # type: ignore[call-arg]
    bad = await fn(Args(genrm_route_key="safety"), Sample("rm -rf /", metadata=meta), client=client)  # type: ignore[call-arg]
    assert (safe["score"], safe["status"]) == (1.0, "ok")
    assert (bad["score"], bad["status"]) == (0.0, "ok")  # the safety judge's 0 on every criterion
    assert bad["pred"] == "0 0"


# ---- a real model -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_service(serve_port: int) -> Iterator[ServeArgs]:
    """A second app on the same Serve: the embedded Gemma 3 270M behind the hf engine."""
    pytest.importorskip("genrm_serve.engines.hf", reason="genrm-serve's hf engine is missing")
    from genrm_serve.testing import require_embedded_model

    require_embedded_model()
    instances = build_instances(
        model_path="embedded",
        engine="hf",
        engine_config={"max_context_len": 1024, "max_batch_size": 4},
        sampling_config={"temperature": 0.0, "max_response_len": 4},
    )
    args = ServeArgs(
        port=serve_port,
        app_name="rewards-gemma",
        route_prefix="/gemma/genrm",
        api_key=None,
        engine_num_cpus=0.5,
    )
    deploy(build_app(instances, args=args), args)
    wait_until_healthy(args, 400)
    yield args


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_gemma_judges_through_dapo_genrm(gemma_service: ServeArgs) -> None:
    """A real model end to end. Gemma 270M is a base model: its verdicts mean nothing and none
    is asserted; the results must still follow the contract (a score, ok or unparsed).
    First use converts the model into ``$GENRM_CACHE_DIR`` (~70 s once), later loads take seconds.
    """
    client = AsyncGenRMClient(base_url=gemma_service.url, timeout=300.0, max_retries=1)
    try:
        one = await compute_score(
            Args(verdict_cache=False),
            Sample(response="6 times 7 is 42. Answer: 42", label="42", prompt="What is 6*7?"),
            client=client,
        )
        group = await compute_score_batch(
            Args(verdict_cache=False),
            [Sample(response=f"Answer: {a}", label="42", prompt="6*7?") for a in ("42", "41")],
            client=client,
        )
    finally:
        await client.aclose()
    print(f"\nGemma verdicts: {one['pred']!r}, {[r['pred'] for r in group]!r}")
    for result in (one, *group):
        assert result["status"] in ("ok", "unparsed"), result
        assert result["score"] in (0.0, 1.0)
