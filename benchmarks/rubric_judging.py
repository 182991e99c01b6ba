"""A rubric's judge questions next to as many unrelated single judgments, same engine, one run.

``rubric-genrm`` asks one judge question per criterion, each the same prompt (instructions, task,
quoted response) up to the criterion at its end, so a response's criteria share their prefix,
and a GRPO group's responses share the task part too. This measures what that sharing is
worth on the embedded judge (hf engine, in this process, no Ray): the same number of judgments,
through the real reward functions (``genrm_rewards.rubric``), four ways:

* ``rubric, per response``: each response's ``--criteria`` criteria in one ``generate_batch``,
  the responses one after another (inline scoring: a response is scored when it finishes);
* ``rubric, whole batch``: the ``--tasks`` × ``--group-size`` responses' criteria in one
  ``generate_batch`` (a batch reward, defer mode);
* ``unrelated, in batches of 5`` / ``unrelated, whole batch``: single-criterion rubric judgments of
  distinct tasks and responses (the same template and lengths, nothing shared but the template's
  instructions), in batches of ``--criteria`` and all at once.

Each row: judgments/s (median of ``--repeats``), the prompt tokens the engine's packed prefill
shared per judgment (its ``prefix_shared_tokens`` counter) and the tokens it computed per
judgment (``forward_tokens``). The engine is called directly (the service's prefix-affinity
routing, which sends a group's keys to one engine, is not in the path: with one engine there is
nothing to route). One output token per judgment, greedy::

    nice -n 19 python benchmarks/rubric_judging.py                  # embedded judge, CPU
    python benchmarks/rubric_judging.py --tasks 4 --group-size 8    # bigger, on a GPU

Timing numbers belong here, never in test assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from genrm_client import GenRMError
from genrm_client.types import GenerateRequest, GenerateResponse, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.hf import HFEngine

CRITERIA = [
    "Addresses the recipient by name",
    "States the date and the time",
    "Is under eighty words",
    "Has a friendly tone",
    "Ends with a clear request for a reply",
    "Mentions the place",
    "Contains no spelling mistakes",
    "Gives a reason for the invitation",
]
TOPICS = [
    "a team lunch",
    "a project review",
    "a farewell party",
    "a code walkthrough",
    "a budget meeting",
    "a training session",
    "a product demo",
    "a hiring panel",
    "a board game night",
    "a quarterly planning day",
    "a charity run",
    "a library visit",
    "a client dinner",
    "a hackathon",
    "a retrospective",
    "a book club",
    "a safety drill",
    "a poster session",
    "a wine tasting",
    "an office move",
]
NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun"]
WORDS = [
    "please",
    "join",
    "us",
    "for",
    "on",
    "at",
    "in",
    "the",
    "by",
    "next",
    "week",
    "this",
    "room",
    "floor",
    "main",
    "hall",
    "we",
    "would",
    "love",
    "to",
    "see",
    "you",
    "there",
    "let",
    "me",
    "know",
    "if",
    "can",
    "make",
    "it",
    "thanks",
    "best",
    "regards",
    "looking",
    "forward",
]


def _response(rng: random.Random, topic: str) -> str:
    """A plausible short invitation (the judge's verdicts are not the point; lengths are)."""
    name = rng.choice(NAMES)
    body = " ".join(rng.choice(WORDS) for _ in range(rng.randint(35, 55)))
    return f"Hi {name}, you are invited to {topic} on Friday at {rng.randint(9, 17)}:00. {body}."


class Sample:
    """What the reward reads (``genrm_rewards.SampleLike``)."""

    def __init__(self, task: str, response: str, rubric: list[dict[str, Any]]) -> None:
        self.prompt = task
        self.response = response
        self.label = None
        self.metadata = {"question": task, "rubric": rubric}


class InProcessJudge:
    """The reward's judge client over an engine in this process (``JudgeClient``)."""

    def __init__(self, engine: HFEngine, sampling: SamplingParams) -> None:
        self.engine = engine
        self.sampling = sampling
        self.prefix_keys: set[str | None] = set()

    async def generate(
        self,
        messages: list[dict[str, str]],
        sampling_params: dict[str, Any] | None = None,
        route_key: str | None = None,
        *,
        prefix_key: str | None = None,
    ) -> str:
        (reply,) = await self.generate_batch(
            [GenerateRequest.model_validate({"messages": messages, "prefix_key": prefix_key})]
        )
        if isinstance(reply, GenRMError):
            raise reply
        return reply.response

    async def generate_batch(
        self, requests: list[GenerateRequest]
    ) -> list[GenerateResponse | GenRMError]:
        self.prefix_keys.update(r.prefix_key for r in requests)
        outs = await self.engine.generate(
            [
                EngineRequest(sampling=self.sampling, messages=r.messages, prefix_key=r.prefix_key)
                for r in requests
            ]
        )
        return [GenerateResponse(response=o.text) for o in outs]


def _workloads(ns: argparse.Namespace) -> tuple[list[Sample], list[Sample]]:
    """The rubric batch (tasks × group, every response with the same ``--criteria``) and as
    many unrelated single-criterion samples (a task and a response each)."""
    rng = random.Random(ns.seed)
    rubric = [{"criterion": c, "weight": 1 + i % 3} for i, c in enumerate(CRITERIA[: ns.criteria])]
    grouped: list[Sample] = []
    for t in range(ns.tasks):
        topic = TOPICS[t % len(TOPICS)]
        task = f"Write a short note inviting a colleague to {topic}."
        grouped += [Sample(task, _response(rng, topic), rubric) for _ in range(ns.group_size)]
    unrelated: list[Sample] = []
    for i in range(len(grouped) * ns.criteria):
        topic = f"{TOPICS[i % len(TOPICS)]} (number {i})"
        task = f"Write a short note inviting a colleague to {topic}."
        criterion = [{"criterion": CRITERIA[i % ns.criteria]}]
        unrelated.append(Sample(task, _response(rng, topic), criterion))
    return grouped, unrelated


#: the engine counters each row reports per judgment
COUNTERS = ("prefix_shared_tokens", "forward_tokens", "batches")


async def _measure(
    judge: InProcessJudge, runs: dict[str, Callable[[], Awaitable[int]]], repeats: int
) -> dict[str, dict[str, Any]]:
    """Every row once untimed (first-call costs out), then ``repeats`` rounds of every row in
    turn (a load that changes over the run touches each row alike); each row's median wall
    and its engine counters over the timed rounds."""
    engine = judge.engine
    for run in runs.values():
        await run()
    walls: dict[str, list[float]] = {name: [] for name in runs}
    counts: dict[str, dict[str, float]] = {name: dict.fromkeys(COUNTERS, 0.0) for name in runs}
    judgments: dict[str, int] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            before = engine.stats()
            t0 = time.perf_counter()
            judgments[name] = await run()
            walls[name].append(time.perf_counter() - t0)
            after = engine.stats()
            for key in COUNTERS:
                counts[name][key] += after.get(key, 0) - before.get(key, 0)
    rows: dict[str, dict[str, Any]] = {}
    for name in runs:
        n = judgments[name] * repeats
        wall = statistics.median(walls[name])
        rows[name] = {
            "judgments": judgments[name],
            "wall_s": round(wall, 3),
            "judgments_per_s": round(judgments[name] / wall, 2),
            "shared_tokens_per_judgment": round(counts[name]["prefix_shared_tokens"] / n, 1),
            "forward_tokens_per_judgment": round(counts[name]["forward_tokens"] / n, 1),
            "engine_batches": round(counts[name]["batches"] / repeats, 1),
        }
    return rows


async def main_async(ns: argparse.Namespace) -> dict[str, Any]:
    from genrm_rewards.rubric import compute_score_batch

    spec = InstanceSpec(
        route_key="judge",
        model_path=ns.model,
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(max_batch_size=ns.max_batch_size, max_context_len=2048),
    )
    engine = HFEngine(spec, "judge/bench")
    await engine.start()
    sampling = SamplingParams(temperature=0.0, max_response_len=1).merged_over(DEFAULT_SAMPLING)
    judge = InProcessJudge(engine, sampling)
    args = argparse.Namespace(judge_batch_size=4096)  # a batch is one engine call, unsplit
    grouped, unrelated = _workloads(ns)

    async def batches(samples: list[Sample], size: int) -> int:
        n = 0
        for start in range(0, len(samples), size):
            results = await compute_score_batch(args, samples[start : start + size], client=judge)
            assert all(r["status"] != "judge_error" for r in results), results
            n += sum(len(r["details"]["criteria"]) for r in results)
        return n

    keys_before = len(judge.prefix_keys)
    await batches(grouped, len(grouped))
    rubric_keys = len(judge.prefix_keys) - keys_before
    rows = await _measure(
        judge,
        {
            "rubric, per response": lambda: batches(grouped, 1),
            "rubric, whole batch": lambda: batches(grouped, len(grouped)),
            f"unrelated, in batches of {ns.criteria}": lambda: batches(unrelated, ns.criteria),
            "unrelated, whole batch": lambda: batches(unrelated, len(unrelated)),
        },
        ns.repeats,
    )
    await engine.shutdown()
    base = rows["unrelated, whole batch"]["judgments_per_s"]
    for row in rows.values():
        row["vs_unrelated_batch"] = round(row["judgments_per_s"] / base, 2)
    return {
        "model": ns.model,
        "tasks": ns.tasks,
        "group_size": ns.group_size,
        "criteria": ns.criteria,
        "repeats": ns.repeats,
        "rubric_prefix_keys": rubric_keys,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", help="judge model_path (hf engine)")
    ap.add_argument("--tasks", type=int, default=2, help="GRPO groups (a task each)")
    ap.add_argument("--group-size", type=int, default=4, help="responses per task")
    ap.add_argument("--criteria", type=int, default=5, choices=range(1, len(CRITERIA) + 1))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-batch-size", type=int, default=64, help="the engine's batch cap")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out", default=None)
    ns = ap.parse_args()
    out = asyncio.run(main_async(ns))
    text = json.dumps(out, indent=2)
    print(text)
    if ns.json_out:
        with open(ns.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
