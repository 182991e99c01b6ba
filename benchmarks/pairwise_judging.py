"""What ranking a group in pairs costs: pairwise-genrm's judgments/s next to single judgments.

One run, one judge service (local Ray + genrm-serve, the embedded Gemma 3 270M judge on the hf
engine by default, started as ``judge_agreement.py`` starts it), the rows interleaved (one of
each, ``--repeats`` times, after a warm-up round) on fresh questions; each row's median, and the
median of its speed against the single judgments of the same round (on a shared machine the
load drifts between rounds, not within one):

* ``pairwise, round robin``: one GRPO group of ``--group-size`` responses to one question,
  ``--rounds`` rounds of a round robin, each pair asked in both orders —
  ``rounds x group/2 x 2`` comparisons, through ``pairwise.compute_score_batch`` (one
  ``generate_batch``, one affinity key: the group's comparisons share their prefix);
* ``pairwise, round robin, with a deadline``: the same group under
  ``group_judge_deadline_s`` (generous: nothing is cut), where every comparison is its own
  request so that those answered in time count;
* ``single judgments``: as many dapo-genrm judgments as the pairwise row asked, each of a
  different question (no prefix in common), through ``dapo_genrm.compute_score_batch`` in one
  ``generate_batch``, verdict cache and rule gate off.

A comparison prompt quotes two responses where a single judgment quotes one answer, so it is
longer; the rows give the mean prompt length in characters beside the rate. The verdicts are
not the point (a 270M judge trained on the consistency question is no pairwise judge): the
share answered with a clean "1"/"0" is reported so a row of unparsed replies is visible.

    python3 benchmarks/pairwise_judging.py                    # CPU, embedded judge
    python3 benchmarks/pairwise_judging.py --url http://127.0.0.1:8000/genrm --route-key judge

Timing numbers belong here, never in test assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass
class Sample:
    """A minimal ``SampleLike`` (rl-core's ``Sample`` has the same fields, and ``group_id``)."""

    response: str
    label: str
    prompt: str
    metadata: dict[str, Any] = field(default_factory=dict)
    group_id: int = 0


def _question(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randrange(10, 99), rng.randrange(10, 99)
    return f"What is {a} + {b}? Explain briefly, then give the answer.", a + b


def _response(rng: random.Random, total: int) -> str:
    answer = total + rng.choice([0, 0, 0, 1, -1, 10])
    steps = rng.choice(
        [
            "Add the tens, then the ones.",
            "Carry the one where the ones add past nine.",
            "Count on from the larger number.",
        ]
    )
    return f"{steps} The sum is {answer}.\nAnswer: {answer}"


def pairwise_group(rng: random.Random, size: int, gid: int) -> list[Sample]:
    question, total = _question(rng)
    return [
        Sample(_response(rng, total), str(total), question, {"question": question}, gid)
        for _ in range(size)
    ]


def unrelated(rng: random.Random, n: int) -> list[Sample]:
    out = []
    for i in range(n):
        question, total = _question(rng)
        out.append(Sample(_response(rng, total), str(total), question, {"question": question}, i))
    return out


def _prompt_chars(calls: list[list[dict[str, str]]]) -> float:
    return statistics.fmean(len(m[-1]["content"]) for m in calls)


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


class Counting:
    """The client, counting the requests and their prompts' lengths."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.prompts: list[list[dict[str, str]]] = []

    async def generate(self, messages: Any, *a: Any, **k: Any) -> Any:
        self.prompts.append(messages)
        return await self.client.generate(messages, *a, **k)

    async def generate_batch(self, requests: list[Any]) -> Any:
        self.prompts += [[m.model_dump() for m in r.messages] for r in requests]
        return await self.client.generate_batch(requests)


async def measure(ns: argparse.Namespace, client: Any) -> dict[str, Any]:
    from genrm_rewards import dapo_genrm, pairwise

    rng = random.Random(ns.seed)
    comparisons = ns.rounds * (ns.group_size // 2) * 2
    base = {
        "genrm_route_key": ns.route_key,
        "verdict_cache": False,
        "rule_gate": False,
        "pairwise_pairing": "round-robin",
        "pairwise_rounds": ns.rounds,
    }
    groups = [pairwise_group(rng, ns.group_size, g) for g in range(ns.repeats + 1)]
    late = [pairwise_group(rng, ns.group_size, g) for g in range(ns.repeats + 1)]
    singles = [unrelated(rng, comparisons) for _ in range(ns.repeats + 1)]
    g = ns.group_size
    plan = [
        (f"pairwise, round robin of {g}", pairwise.compute_score_batch, groups, base),
        (
            f"pairwise, round robin of {g}, with a deadline",
            pairwise.compute_score_batch,
            late,
            {**base, "group_judge_deadline_s": ns.timeout_s},
        ),
        (
            f"{comparisons} unrelated single judgments",
            dapo_genrm.compute_score_batch,
            singles,
            base,
        ),
    ]
    seen: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, *_ in plan}
    # interleaved (ABC ABC ...): on a shared machine the load drifts, and each repetition's
    # rows then see about the same load; the first repetition is a warm-up, not counted
    for rep in range(ns.repeats + 1):
        for name, run, samples, args in plan:
            counting = Counting(client)
            t0 = time.perf_counter()
            results = await run(argparse.Namespace(**args), samples[rep], client=counting)
            seconds = time.perf_counter() - t0
            n = len(counting.prompts)
            if name.startswith("pairwise"):
                ok = sum(r["details"]["pairwise"]["comparisons"] for r in results) / 2
            else:
                ok = sum(1 for r in results if r["status"] == "ok")
            if rep:
                seen[name].append((seconds, _prompt_chars(counting.prompts), ok / n, n))
    single = seen[plan[-1][0]]
    ratios = {
        name: [s[0] / r[0] for r, s in zip(runs, single, strict=True)]
        for name, runs in seen.items()
    }
    rows: dict[str, dict[str, Any]] = {}
    for name, runs in seen.items():
        wall = statistics.median(t for t, *_ in runs)
        n = runs[0][3]
        rows[name] = {
            "judgments": n,
            "judgments_per_s": round(n / wall, 2),
            "median_s": round(wall, 3),
            # per repetition, against the single judgments of the same repetition
            "speed_vs_single_median": round(statistics.median(ratios[name]), 2),
            # the middle half of the rounds' ratios: how far the machine's load moved them
            "speed_vs_single_quartiles": [round(q, 2) for q in _quartiles(ratios[name])],
            "prompt_chars_mean": round(statistics.fmean(c for _, c, _, _ in runs)),
            "clean_verdict_share": round(statistics.fmean(k for _, _, k, _ in runs), 3),
        }
        print(f"  {name}: {rows[name]}", file=sys.stderr, flush=True)
    return rows


async def main_async(ns: argparse.Namespace, url: str) -> dict[str, Any]:
    import genrm_client

    client = genrm_client.AsyncGenRMClient(base_url=url, timeout=ns.timeout_s)
    try:
        return await measure(ns, client)
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running genrm-serve (e.g. http://127.0.0.1:8000/genrm)")
    parser.add_argument("--route-key", default=None, help="the instance to measure")
    parser.add_argument("--model", default="embedded", help="judge model_path when starting")
    parser.add_argument("--engine", default="hf", help="engine when starting serve")
    parser.add_argument("--engine-config", default='{"max_context_len": 2048}', help="JSON")
    parser.add_argument(
        "--sampling-config", default='{"temperature": 0.0, "max_response_len": 2}', help="JSON"
    )
    parser.add_argument("--num-cpus", type=int, default=4, help="Ray CPUs (logical) when starting")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds")
    parser.add_argument("--repeats", type=int, default=8, help="timed repeats per row")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="client deadline per call")
    parser.add_argument("--json-out", type=Path, default=None)
    ns = parser.parse_args()
    stop = None
    url = ns.url or ""
    if not ns.url:
        from judge_agreement import start_service

        # the judge alone (no base instance), as judge_agreement.py --no-base starts it
        ns.adapter, ns.no_base = None, True
        url, keys, stop = start_service(ns)
        ns.route_key = keys[0]
    try:
        rows = asyncio.run(main_async(ns, url))
    finally:
        if stop is not None:
            stop()
    out = {
        "judge": ns.model if not ns.url else url,
        "engine": ns.engine,
        "group_size": ns.group_size,
        "rounds": ns.rounds,
        "rows": rows,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if ns.json_out:
        ns.json_out.parent.mkdir(parents=True, exist_ok=True)
        ns.json_out.write_text(text + "\n")


if __name__ == "__main__":
    main()
