"""How often does a judge, through the dapo-genrm prompt, agree with labelled answer pairs?

Runs the labelled (reference, prediction, equivalent?) pairs of ``shared/data/judge-eval/``
through ``genrm_rewards.dapo_genrm.compute_score_batch`` against a judge and reports agreement
with the labels, the unparsed rate, judge errors and judgments/s; with ``--rule-gate`` also how
many pairs the math-verify gate settled without a judge call. ``--rule-only`` measures
math-verify alone against the labels (no judge at all), which is what the gate relies on.

    # math-verify alone (no service needed)
    python benchmarks/judge_agreement.py --rule-only
    # a running service
    python benchmarks/judge_agreement.py --url http://127.0.0.1:8000/genrm [--rule-gate]
    # start genrm-serve in-process on a free port (default: the embedded Gemma, hf engine)
    python benchmarks/judge_agreement.py [--model embedded --engine hf] [--rule-gate]

Timing numbers belong here, never in test assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NO_QUESTION = "(not given: decide whether the model answer equals the standard answer)"


@dataclass
class Pair:
    """One labelled pair, shaped as a ``SampleLike`` for the reward function."""

    source: str
    label: str
    pred: str
    equivalent: bool
    question: str = NO_QUESTION
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return self.question

    @property
    def response(self) -> str:
        return f"Answer: {self.pred}"


def shared_dir() -> Path:
    """``$GENRM_SHARED_DIR``, else ``<repo>/../shared``, else ``/work/shared``."""
    env = os.environ.get("GENRM_SHARED_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[1].parent / "shared", Path("/work/shared")]
    for path in candidates:
        if (path / "data" / "judge-eval").is_dir():
            return path
    raise SystemExit(f"judge-eval data not found in {[str(c) for c in candidates]}")


def load_pairs(data_dir: Path) -> list[Pair]:
    """Every pair of every ``*.jsonl`` file, whatever its field names."""
    pairs: list[Pair] = []
    for path in sorted(data_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            gold_key = "gold" if "gold" in row else "expected_answer"
            pred_key = "pred" if "pred" in row else "predicted_answer"
            label_key = (
                "expected_equivalent" if "expected_equivalent" in row else "label_equivalent"
            )
            if not {gold_key, pred_key, label_key} <= row.keys():
                raise SystemExit(f"{path.name}: row without gold/pred/label: {line[:120]}")
            # A null prediction (no answer given) is judged as an empty answer.
            gold, pred = ("" if row[k] is None else str(row[k]) for k in (gold_key, pred_key))
            pair = Pair(path.stem, gold, pred, bool(row[label_key]))
            if row.get("problem"):
                pair.question = str(row["problem"])
            pair.metadata = {"question": pair.question, "label": pair.label}
            pairs.append(pair)
    return pairs


def report(pairs: list[Pair], results: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Agreement, rates and a confusion matrix over the pairs that got a verdict."""
    statuses = Counter(r["status"] for r in results)
    scored = [(p, r) for p, r in zip(pairs, results, strict=True) if r["score"] is not None]
    confusion = Counter(
        ("T" if (r["score"] >= 1.0) == p.equivalent else "F") + ("P" if r["score"] >= 1.0 else "N")
        for p, r in scored
    )
    agree = confusion["TP"] + confusion["TN"]
    by_source: dict[str, list[int]] = {}
    for p, r in scored:
        by_source.setdefault(p.source, [0, 0])
        by_source[p.source][0] += int((r["score"] >= 1.0) == p.equivalent)
        by_source[p.source][1] += 1
    gates = Counter(r.get("gate", "off") for r in results)
    return {
        "pairs": len(pairs),
        "agreement": round(agree / len(scored), 4) if scored else None,
        "unparsed_rate": round(statuses["unparsed"] / len(pairs), 4),
        "judge_errors": statuses["judge_error"],
        "confusion": dict(confusion),
        "gate_hit_rate": round(gates["hit"] / len(pairs), 4)
        if gates.get("off") != len(pairs)
        else None,
        "gate_states": dict(gates),
        "judgments_per_s": round(len(pairs) / seconds, 2),
        "seconds": round(seconds, 2),
        "by_source": {k: f"{a}/{n}" for k, (a, n) in sorted(by_source.items())},
    }


async def run_rule_only(pairs: list[Pair], timeout_s: float) -> list[dict[str, Any]]:
    from genrm_rewards.rules import math_equal

    out: list[dict[str, Any]] = []
    for p in pairs:  # sequential: the numbers are math-verify's, not the pool's
        equal = await math_equal(p.label, p.pred, timeout_s=timeout_s)
        if equal is None:
            out.append({"score": None, "status": "judge_error", "gate": "timeout"})
        else:
            out.append({"score": float(equal), "status": "ok", "gate": "hit" if equal else "miss"})
    return out


async def run_judge(pairs: list[Pair], client: Any, ns: argparse.Namespace) -> list[dict[str, Any]]:
    from genrm_rewards.dapo_genrm import compute_score_batch

    args = argparse.Namespace(
        genrm_route_key=ns.route_key,
        rule_gate=ns.rule_gate,
        verdict_cache=False,  # measure the judge, not the cache
        lenient_verdict=ns.lenient,
        reward_sampling_params=ns.sampling_params,
    )
    results: list[dict[str, Any]] = []
    for start in range(0, len(pairs), ns.batch_size):
        chunk = pairs[start : start + ns.batch_size]
        results.extend(dict(r) for r in await compute_score_batch(args, chunk, client=client))
        print(f"  {len(results)}/{len(pairs)}", file=sys.stderr, flush=True)
    return results


def make_client(url: str, timeout_s: float) -> Any:
    import genrm_client

    return genrm_client.AsyncGenRMClient(base_url=url, timeout=timeout_s)


def start_service(ns: argparse.Namespace) -> tuple[str, Any]:
    """Start a local Ray + genrm-serve (one instance of ``--model`` / ``--engine``) on a free port.

    Returns ``(url, stop)``.
    """
    try:
        from genrm_serve.testing import free_port, ray_test_env

        ray_test_env()  # before ray is imported: workers use this environment
        import ray
        from ray import serve

        from genrm_serve.app import build_app, deploy, wait_until_healthy
        from genrm_serve.config import build_instances
        from genrm_serve.serve_args import ServeArgs
    except ImportError as err:
        raise SystemExit(f"starting a judge needs genrm-serve ({err}); or pass --url") from err
    port = free_port()
    ray.init(address="local", num_cpus=ns.num_cpus, include_dashboard=False, log_to_driver=False)

    def stop() -> None:
        serve.shutdown()
        ray.shutdown()

    try:
        instances = build_instances(
            model_path=ns.model,
            engine=ns.engine,
            engine_config=json.loads(ns.engine_config),
            sampling_config=json.loads(ns.sampling_config),
        )
        args = ServeArgs(port=port, app_name="judge-agreement", api_key=None, engine_num_cpus=1.0)
        deploy(build_app(instances, args=args), args)
        wait_until_healthy(args, ns.start_timeout_s)
    except BaseException:
        stop()
        raise
    return args.url, stop


async def main_async(ns: argparse.Namespace) -> dict[str, Any]:
    pairs = load_pairs(shared_dir() / "data" / "judge-eval")
    if ns.limit:
        pairs = pairs[: ns.limit]
    started = time.perf_counter()
    if ns.rule_only:
        from genrm_rewards.rules import math_equal

        await math_equal("1", "1", timeout_s=60)  # import sympy outside the timing
        started = time.perf_counter()
        results = await run_rule_only(pairs, ns.rule_timeout_s)
        mode = "rule-only (math-verify)"
    else:
        client = make_client(ns.url, ns.timeout_s)
        started = time.perf_counter()
        results = await run_judge(pairs, client, ns)
        judge = getattr(ns, "started", None) or ns.url
        mode = f"judge {judge} route_key={ns.route_key} rule_gate={ns.rule_gate}"
        aclose = getattr(client, "aclose", None)
        if aclose is not None:
            await aclose()
    out = {"mode": mode, **report(pairs, results, time.perf_counter() - started)}
    if ns.show_disagreements:
        for p, r in zip(pairs, results, strict=True):
            if r["score"] is not None and (r["score"] >= 1.0) != p.equivalent:
                print(
                    f"  disagree [{p.source}] gold={p.label!r} pred={p.pred!r} label="
                    f"{p.equivalent} verdict={r.get('pred')!r}",
                    file=sys.stderr,
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", help="base URL of a running genrm-serve (e.g. http://127.0.0.1:8000/genrm)"
    )
    parser.add_argument(
        "--model", default="embedded", help="judge model_path when starting serve (embedded Gemma)"
    )
    parser.add_argument("--engine", default="hf", help="engine when starting serve")
    parser.add_argument("--engine-config", default='{"max_context_len": 2048}', help="JSON")
    parser.add_argument(
        "--sampling-config", default='{"temperature": 0.0, "max_response_len": 8}', help="JSON"
    )
    parser.add_argument("--num-cpus", type=int, default=2, help="Ray CPUs when starting serve")
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    parser.add_argument("--route-key", default=None)
    parser.add_argument(
        "--rule-gate", action="store_true", help="math-verify gate before the judge"
    )
    parser.add_argument("--rule-only", action="store_true", help="math-verify alone, no judge")
    parser.add_argument("--rule-timeout-s", type=float, default=5.0)
    parser.add_argument("--lenient", action="store_true", help="lenient verdict parsing")
    parser.add_argument("--sampling-params", default=None, help='JSON, e.g. {"temperature": 0}')
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="client deadline per call")
    parser.add_argument("--limit", type=int, default=0, help="only the first N pairs")
    parser.add_argument("--show-disagreements", action="store_true")
    parser.add_argument("--json-out", type=Path, default=None)
    ns = parser.parse_args()
    stop = None
    if not ns.rule_only and not ns.url:
        ns.url, stop = start_service(ns)
        ns.started = f"{ns.model} ({ns.engine} engine, in-process genrm-serve)"
    try:
        out = asyncio.run(main_async(ns))
    finally:
        if stop is not None:
            stop()
    print(json.dumps(out, indent=2))
    if ns.json_out:
        ns.json_out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
