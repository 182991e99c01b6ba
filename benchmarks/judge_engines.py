"""The judge workload on every engine, one process, the same weights: one table.

GRPO-shaped judge batches (``hf_engine.py``'s ``judge`` workload: ``--groups`` groups of
``--group-size``, ``--shared`` tokens common to a group then ``--private`` of each sample's own,
one output token, greedy), random weights of ``--shape`` (default the Qwen3-4B shape) built on the
GPU and saved once, so that SGLang loads exactly the weights the transformers rows use. Rows:

1. plain transformers, one batched forward (the baseline);
2. our hf engine (packed group prefixes, compiled layers);
3. raw ``sglang.Engine``, the batch's prompts sent together, radix cache on (fresh groups);
4. our SGLang engine, the whole batch at once (defer mode, ``generate_batch``): each group's
   shared run computed first, its members sent when it finished (the engine's default: every
   warm-up in one wave); then the same with the warm-ups in waves of ``WAVES_COMPARED`` tokens
   (fresh prompts);
5. our SGLang engine through its worker, the samples arriving spread over ``--spread-ms`` (inline
   scoring as rollouts finish): what SGLang's radix cache gives without the batch-level warm-up;
6. the compute bound on unique tokens at ``--tflops``;
7. through the service: the same engine in process on chat messages (text groups of about the
   same lengths, rendered and tokenised by the engine), then one ``POST /genrm/generate_batch``
   of those messages to genrm-serve with one SGLang judge engine (Ray Serve, HTTP, the router,
   the engine actor): the ratio of the two is the service's cost (``--no-service`` skips it).

Every row has fresh groups (new random prompts), so no row is helped by an earlier one's cache.
Verdict agreement: each SGLang row's greedy token against raw SGLang's on the same prompts.

    python3 benchmarks/judge_engines.py --server-args '{"attention_backend": "triton",
        "sampling_backend": "pytorch"}'          # SGLang on PYTHONPATH (sglang_env.sh)

``--profile DIR`` also runs one batch of raw SGLang and one of ours under SGLang's torch profiler
and prints their GPU kernels by total time and by kind; ``--sglang-only`` skips the plain and hf
rows (an SGLang setting compared with itself).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_engine  # the judge workload and the hf rows: one owner of both

RESULTS: dict[str, Any] = {"rows": []}


#: ``--out``: the JSON results, written after each row (a run cut short keeps what it measured)
OUT: Path | None = None


def row(name: str, n: int, seconds: float, base: float | None, **extra: Any) -> None:
    RESULTS["rows"].append({"path": name, "judgments_s": n / seconds, "s": seconds, **extra})
    if OUT is not None:
        OUT.write_text(json.dumps(RESULTS, default=str))
    ratio = f"{base / seconds:.2f}x" if base else "-"
    print(f"| {name} | {n / seconds:.1f} | {seconds * 1e3:.0f} | {ratio} |", flush=True)


def fresh(args: argparse.Namespace, vocab: int, seed: int) -> list[list[int]]:
    # _judge_prompts draws from a fixed seed: each row shifts every token to get fresh groups
    prompts = hf_engine._judge_prompts(
        args.groups, args.group_size, args.shared, args.private, vocab, False
    )
    offset = seed * 7919
    return [[10 + (t + offset) % (vocab - 10) for t in p] for p in prompts]


def with_group_keys(reqs: list[Any], args: argparse.Namespace, tag: str) -> list[Any]:
    """Each request's affinity key (``prefix_key``): its group, as the rewards set it, so that
    through the service's router a group's spread arrivals all reach one engine. ``fresh``
    lists prompts group by group."""
    for i, r in enumerate(reqs):
        r.prefix_key = f"{tag}/group-{i // args.group_size}"
    return reqs


def text_batch(tokenizer: Any, args: argparse.Namespace, seed: int) -> list[str]:
    """The judge workload as the service takes it, text: per group, a shared run of random
    words of about ``--shared`` tokens, then each sample's own of about ``--private``."""
    import random

    rng = random.Random(seed)

    def words(n_tokens: int) -> str:
        out: list[str] = []
        while len(tokenizer(" ".join(out), add_special_tokens=False)["input_ids"]) < n_tokens:
            out += [f"w{rng.randrange(0, 1000)}" for _ in range(8)]
        return " ".join(out)

    texts = []
    for _ in range(args.groups):
        shared = words(args.shared)
        texts += [f"{shared}\n{words(args.private)}" for _ in range(args.group_size)]
    return texts


def message_requests(texts: list[str]) -> list[Any]:
    from genrm_client.types import Message, SamplingParams
    from genrm_serve.config import DEFAULT_SAMPLING
    from genrm_serve.engines.base import EngineRequest

    sampling = SamplingParams(temperature=0.0, max_response_len=1).merged_over(DEFAULT_SAMPLING)
    return [
        EngineRequest(sampling=sampling, messages=[Message(role="user", content=t)]) for t in texts
    ]


def sglang_spec(model_dir: Path, args: argparse.Namespace, extra: dict[str, Any]) -> Any:
    from genrm_serve.config import EngineConfig, InstanceSpec

    return InstanceSpec(
        route_key="judge",
        model_path=str(model_dir),
        num_gpus=1,
        engine="sglang",
        engine_config=EngineConfig(
            max_batch_size=args.groups * args.group_size,
            # the message rows' texts run over their token targets by up to a few words, and
            # the chat template adds its own (725 tokens at 550 + 150 on the H200, 2026-12-03)
            max_context_len=args.shared + args.private + 128,
            mem_fraction_static=0.6,
            server_args=extra,
        ),
    )


#: Two first tokens whose log-probs at raw SGLang are this close are a bf16 tie: a cached
#: prefix (ours) and a full prefill (raw) round differently, and either may win.
TIE_NATS = 0.1
#: The wave size the second batch row compares with the default of one wave (tokens of runs).
WAVES_COMPARED = 2048


def raw_rows(
    model_dir: Path,
    args: argparse.Namespace,
    extra: dict[str, Any],
    vocab: int,
    policy: str | None = None,
) -> Any:
    """Raw ``sglang.Engine``, the batch's prompts in one call (SGLang's default scheduling, or
    ``schedule_policy=policy``: "lpm" is SGLang's own answer to shared prefixes, which
    schedules one request of those sharing a prefix first). Returns, per repeat, each prompt's
    greedy token and its margin over the runner-up (nats)."""
    import sglang

    eng = sglang.Engine(
        model_path=str(model_dir),
        dtype="bfloat16",
        mem_fraction_static=0.6,
        enable_memory_saver=True,
        cuda_graph_backend_prefill="disabled",
        context_length=args.shared + args.private + 16,
        **({"schedule_policy": policy} if policy else {}),
        **extra,
    )
    n = args.groups * args.group_size
    sp = {"max_new_tokens": 1, "temperature": 0.0}
    top2 = {"return_logprob": True, "top_logprobs_num": 2}
    eng.generate(input_ids=fresh(args, vocab, 100), sampling_params=sp, **top2)  # warm-up
    tokens: dict[int, list[tuple[int, float]]] = {}
    times = []
    for rep in range(args.repeats):
        prompts = fresh(args, vocab, 200 + rep)
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params=sp, **top2)
        times.append(time.perf_counter() - t0)
        tokens[200 + rep] = [_token_and_margin(o) for o in outs]
    if PROFILE is not None and not policy:
        where = PROFILE / "raw"
        eng.start_profile(output_dir=str(where), activities=["GPU"])
        eng.generate(input_ids=fresh(args, vocab, 700), sampling_params=sp, **top2)
        eng.stop_profile()
        kernel_summary(where, "raw SGLang, the batch together")
    wall = sorted(times)[len(times) // 2]
    name = "raw sglang.Engine, the batch together (fresh groups)"
    if policy:
        name += f", schedule_policy={policy}"
    row(name, n, wall, RESULTS["plain_s"])
    eng.shutdown()
    return tokens


#: ``--profile``: the folder SGLang's torch profiler writes its traces to (one batch each of raw
#: SGLang and ours, GPU activity), summarised by kernel after each
PROFILE: Path | None = None


def kernel_summary(folder: Path, label: str, top: int = 12) -> None:
    """The GPU kernels of the traces in ``folder`` (SGLang's profiler: chrome traces), by total
    time, and by kind (matrix multiplies, attention, the rest): where a batch's GPU time went."""
    import gzip
    from collections import Counter

    by_name: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for trace in sorted(folder.rglob("*.json*")):
        opener = gzip.open if trace.suffix == ".gz" else open
        with opener(trace, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        for e in events:
            if e.get("cat") == "kernel":
                by_name[e["name"][:90]] += float(e.get("dur", 0.0)) / 1e3
                calls[e["name"][:90]] += 1

    def kind(name: str) -> str:
        low = name.lower()
        if any(k in low for k in ("gemm", "nvjet", "xmma", "cutlass", "matmul")):
            return "matrix multiply"
        if "norm" in low:  # flashinfer's RMSNorm kernels are not attention
            return "other"
        keys = ("attention", "attn", "_fwd_kernel", "prefillwith", "decodewith", "mergestate")
        return "attention" if any(k in low for k in keys) else "other"

    kinds: Counter[str] = Counter()
    for name, ms in by_name.items():
        kinds[kind(name)] += ms
    total = sum(by_name.values())
    RESULTS.setdefault("profiles", {})[label] = {
        "kernel_ms": total,
        "by_kind_ms": dict(kinds),
        "top": [(n, ms, calls[n]) for n, ms in by_name.most_common(top)],
    }
    if OUT is not None:
        OUT.write_text(json.dumps(RESULTS, default=str))
    print(
        f"\nkernels of one batch, {label}: {total:.1f} ms in all; "
        + ", ".join(f"{k} {ms:.1f} ms" for k, ms in kinds.most_common())
    )
    for name, ms in by_name.most_common(top):
        print(f"  {ms:8.2f} ms  {calls[name]:5d} x  {name}")


def _token_and_margin(out: dict[str, Any]) -> tuple[int, float]:
    top = out["meta_info"]["output_top_logprobs"][0]  # [(logprob, token_id, text), ...]
    margin = float(top[0][0]) - float(top[1][0]) if len(top) > 1 else float("inf")
    return int(out["output_ids"][0]), margin


def agreement(outs: list[Any], raw: list[tuple[int, float]]) -> tuple[int, int]:
    """(greedy tokens equal to raw's, differing where raw's margin is beyond a bf16 tie)."""
    equal = beyond_tie = 0
    for o, (token, margin) in zip(outs, raw, strict=True):
        if (o.token_ids or [-1])[0] == token:
            equal += 1
        elif margin > TIE_NATS:
            beyond_tie += 1
    return equal, beyond_tie


async def batch_row(
    engine: Any, worker: Any, args: argparse.Namespace, vocab: int, raw: Any, seed: int, tag: str
) -> None:
    """Our SGLang engine on the whole batch at once, median of ``--repeats`` (prompts of
    ``seed + rep``); each group's members go out when its warm-up finished, the warm-ups in
    waves of ``engine.warmup_policy.wave_tokens`` (``tag`` names the setting). Greedy agreement
    with raw SGLang where ``raw`` has the same prompts. ``first_wave_ms``: the batch's one serial
    phase, its first wave of warm-ups (later waves run beside members)."""
    n = args.groups * args.group_size
    times, agree, beyond_tie, first_waves = [], 0, 0, []
    wave = engine._warm_wave
    waves_seen: list[float] = []

    async def timed_wave(*a: Any) -> None:
        t = time.perf_counter()
        await wave(*a)
        waves_seen.append(time.perf_counter() - t)

    engine._warm_wave = timed_wave
    try:
        for rep in range(args.repeats):
            reqs = hf_engine._requests(fresh(args, vocab, seed + rep), max_response_len=1)
            for r in reqs:
                r.sampling = r.sampling.model_copy(update={"temperature": 0.0})
            waves_seen.clear()
            t0 = time.perf_counter()
            outs = await worker.generate_many(reqs)
            times.append(time.perf_counter() - t0)
            first_waves.append(waves_seen[0] if waves_seen else 0.0)
            if raw is not None:
                equal, beyond = agreement(outs, raw[seed + rep])
                agree, beyond_tie = agree + equal, beyond_tie + beyond
    finally:
        engine._warm_wave = wave
    agreement_cols: dict[str, Any] = {}
    if raw is not None:
        agreement_cols = {
            "greedy_equal_raw": f"{agree}/{n * args.repeats}",
            "greedy_differs_beyond_a_tie": beyond_tie,
        }
    tokens = engine.warmup_policy.wave_tokens
    row(
        f"our SGLang engine, the batch at once, warm-ups {tag} (PREFIX_WARM_WAVE_TOKENS={tokens})",
        n,
        sorted(times)[len(times) // 2],
        RESULTS["plain_s"],
        **agreement_cols,
        warm_waves=len(waves_seen),
        first_wave_ms_median=1e3 * sorted(first_waves)[len(first_waves) // 2],
        counters=dict(engine.counters),
    )


async def ours_rows(
    model_dir: Path, args: argparse.Namespace, extra: dict[str, Any], vocab: int, raw: Any
) -> None:
    from genrm_serve.engines.sglang import SGLangEngine
    from genrm_serve.engines.worker import EngineWorker

    spec = sglang_spec(model_dir, args, extra)
    engine = SGLangEngine(spec, "judge/0")
    worker = EngineWorker(spec, 0, engine=engine)
    await worker.start()
    n = args.groups * args.group_size
    try:
        await engine.generate(hf_engine._requests(fresh(args, vocab, 100), max_response_len=1))
        await batch_row(engine, worker, args, vocab, raw, 200, "in one wave (default)")
        if PROFILE is not None:
            assert engine._thread is not None
            where = PROFILE / "ours"
            start = engine.sgl.start_profile
            await engine._thread.call(lambda: start(output_dir=str(where), activities=["GPU"]))
            reqs = hf_engine._requests(fresh(args, vocab, 800), max_response_len=1)
            await worker.generate_many(reqs)
            await engine._thread.call(engine.sgl.stop_profile)
            kernel_summary(where, "our SGLang engine, the batch at once (default)")
        # the same with the warm-ups in waves (fresh prompts: no help from the row above)
        policy = engine.warmup_policy
        engine.warmup_policy = dataclasses.replace(policy, wave_tokens=WAVES_COMPARED)
        try:
            await batch_row(engine, worker, args, vocab, None, 500, "in waves")
        finally:
            engine.warmup_policy = policy
        # inline scoring: the samples arrive one by one, spread over the window
        # (one engine here, so the keys change nothing; with several behind the router they
        # keep each group on one engine's radix cache)
        reqs = with_group_keys(
            hf_engine._requests(fresh(args, vocab, 300), max_response_len=1), args, "spread"
        )
        gap = args.spread_ms / 1e3 / max(len(reqs) - 1, 1)
        cached_before = engine.counters["cached_prompt_tokens"]
        followed_before = engine.counters["followed"]

        async def one(i: int, r: Any) -> Any:
            await asyncio.sleep(i * gap)
            return await worker.generate(r)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
        wall = time.perf_counter() - t0
        cached = engine.counters["cached_prompt_tokens"] - cached_before
        followed = engine.counters["followed"] - followed_before
        row(
            f"our SGLang engine, samples spread over {args.spread_ms:.0f} ms (one engine)",
            n,
            wall,
            RESULTS["plain_s"],
            cached_prompt_tokens=cached,
            # samples that waited for their group's run, computed by an earlier one in flight
            followed=followed,
            prompt_tokens=n * (args.shared + args.private),
            # what the window's arrivals cannot explain: the last sample's wait after it came
            after_last_arrival_ms=1e3 * (wall - gap * (len(reqs) - 1)),
            # a prompt's shared run computed once per group: the most a cache can save
            cacheable_tokens=args.groups * (args.group_size - 1) * args.shared,
        )
        # the service's comparison: the same engine in process, on the chat messages it sends
        assert engine.prompts is not None
        tokenizer = engine.prompts.tokenizer
        await worker.generate_many(message_requests(text_batch(tokenizer, args, 399)))
        times = []
        for rep in range(args.repeats):
            reqs = message_requests(text_batch(tokenizer, args, 400 + rep))
            t0 = time.perf_counter()
            outs = await worker.generate_many(reqs)
            times.append(time.perf_counter() - t0)
            assert all(o.completion_tokens == 1 for o in outs)
        RESULTS["messages_in_process_s"] = wall = sorted(times)[len(times) // 2]
        row(
            "our SGLang engine in process, chat messages",
            n,
            wall,
            RESULTS["plain_s"],
            prompt_tokens=sum(o.prompt_tokens for o in outs),
        )
    finally:
        await worker.shutdown()


def service_row(model_dir: Path, args: argparse.Namespace, extra: dict[str, Any]) -> None:
    """One ``POST /genrm/generate_batch`` of the chat messages of the in-process row (the same
    texts, a fresh engine: no cache from that row), median of ``--repeats`` after a warm-up."""
    from genrm_serve.testing import free_port, ray_test_env

    ray_test_env()
    import httpx
    import ray
    from ray import serve
    from transformers import AutoTokenizer

    from genrm_serve.app import build_app, deploy, wait_until_healthy
    from genrm_serve.serve_args import ServeArgs

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    spec = sglang_spec(model_dir, args, extra)
    sargs = ServeArgs(port=free_port(), app_name="judge-engines", api_key=None)
    ray.init(address="local", num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        deploy(build_app({"judge": spec}, args=sargs), sargs)
        wait_until_healthy(sargs, 900)
        sampling = {"temperature": 0.0, "max_response_len": 1}

        def body(seed: int) -> dict[str, Any]:
            return {
                "requests": [
                    {"messages": [{"role": "user", "content": t}], "sampling_params": sampling}
                    for t in text_batch(tokenizer, args, seed)
                ]
            }

        with httpx.Client(base_url=sargs.url, timeout=600) as client:
            client.post("/generate_batch", json=body(399)).raise_for_status()
            times = []
            for rep in range(args.repeats):
                payload = body(400 + rep)
                t0 = time.perf_counter()
                r = client.post("/generate_batch", json=payload)
                times.append(time.perf_counter() - t0)
                r.raise_for_status()
                assert all("response" in x for x in r.json()["results"]), r.text[:300]
        wall = sorted(times)[len(times) // 2]
        n = args.groups * args.group_size
        row(
            "the same through the service: POST /generate_batch",
            n,
            wall,
            RESULTS["plain_s"],
            vs_in_process=RESULTS["messages_in_process_s"] / wall,
        )
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-4b", choices=sorted(hf_engine.SHAPES))
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--shared", type=int, default=550)
    ap.add_argument("--private", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spread-ms", type=float, default=1000.0)
    ap.add_argument("--tflops", type=float, default=790.0)
    ap.add_argument("--server-args", default="{}", help="JSON: SGLang server args (both rows)")
    ap.add_argument("--out", default=None, help="JSON results, written after each row")
    ap.add_argument("--no-service", action="store_true", help="skip the service row (no Ray)")
    ap.add_argument(
        "--no-lpm", action="store_true", help="skip raw SGLang with schedule_policy lpm"
    )
    ap.add_argument(
        "--profile", default=None, help="folder: profile one batch of raw SGLang and of ours"
    )
    ap.add_argument(
        "--sglang-only", action="store_true", help="skip the plain and hf rows (weights only)"
    )
    args = ap.parse_args()
    global OUT, PROFILE
    OUT = Path(args.out) if args.out else None
    PROFILE = Path(args.profile) if args.profile else None
    extra = json.loads(args.server_args)
    if not args.no_service:
        # Ray before SGLang: an SGLang install that stubs IPython (the GPU machine's trimmed
        # one) leaves a module Ray's logging then takes for a notebook (ImportError: get_ipython)
        import ray  # noqa: F401
    # the hf rows (hf_engine's own code), then the weights saved for SGLang
    hf_args = argparse.Namespace(
        shape=args.shape, model=None, engine_module=None, groups=args.groups,
        group_size=args.group_size, shared=args.shared, private=args.private,
        repeats=args.repeats, kinds="grouped", no_plain=False, profile=None,
    )  # fmt: skip
    engine = hf_engine._engine(hf_args, args.shared + args.private + 8)
    model = engine.model
    vocab = int(model.config.vocab_size)
    n = args.groups * args.group_size
    print(f"judge: {args.shape}, {args.groups} x {args.group_size}, {args.shared} + {args.private}")
    print("| path | judgments/s | ms per batch | vs plain |\n|---|---|---|---|")
    prompts = fresh(args, vocab, 200)
    RESULTS["plain_s"] = plain_s = None
    if not args.sglang_only:
        plain_s, _cpu, _ = hf_engine._timed(hf_engine._plain_forward(model, prompts), args.repeats)
        RESULTS["plain_s"] = plain_s
        row("plain transformers, one batched forward", n, plain_s, None)
        reqs = hf_engine._requests(prompts, temperature=0.0, max_response_len=1)

        def run_hf(e: Any = engine) -> Any:
            return asyncio.run(e.generate(reqs))

        hf_s, _cpu, _ = hf_engine._timed(run_hf, args.repeats)
        row("our hf engine (packed group prefixes, compiled)", n, hf_s, plain_s)
    folder = Path(engine.spec.model_path)
    with hf_engine._eager(model):
        model.save_pretrained(str(folder))
    params = sum(p.numel() for p in model.parameters())
    unique = args.groups * (args.shared + args.group_size * args.private)
    del engine, model
    gc.collect()
    torch.cuda.empty_cache()
    raw = raw_rows(folder, args, extra, vocab)
    if not args.no_lpm:
        raw_rows(folder, args, extra, vocab, policy="lpm")
    asyncio.run(ours_rows(folder, args, extra, vocab, raw))
    if not args.no_service:
        service_row(folder, args, extra)
    bound_s = 2 * params * unique / (args.tflops * 1e12)
    row(f"compute bound on unique tokens ({args.tflops:.0f} TFLOP/s)", n, bound_s, plain_s)


if __name__ == "__main__":
    main()
