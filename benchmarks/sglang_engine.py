"""Our SGLang engine against raw ``sglang.Engine`` on one GPU, same process, same shapes.

Random weights (``load_format="dummy"``) of the Qwen3-0.6B shape (28 x 1024, MLP 3072, 16 / 8
heads, head_dim 128, vocab 151,936) with genrm-serve's tiny tokenizer. Rows:

- rollout, 64 prompts x 128 tokens, 512 new tokens at T = 1, the second call of each path
  timed: raw ``sgl.Engine.generate`` of the 64 prompts (end of sequence ignored), tokens only
  and, the ratios' baseline, with each token's log-prob as ours return them; our engine
  through its worker (8 GRPO groups of 8, each group one ``generate_many`` call, all 8 in
  flight, as a judge service or rl-core sends them); our engine through rl-core's rollout
  (``generate_groups``, 8 groups of 8, prompts built to tokenise to exactly 128 ids). Ours stop
  at an end of sequence, which a random model over 151,936 ids almost never samples (the tiny
  tokenizer's), so the tokens generated match (each row reports its count);
- weight sync, every parameter in bf16: SGLang's own ``update_weights_from_tensor`` of the
  tensors, then ours (the trainer's flat buckets shared through CUDA IPC, mapped by SGLang's
  scheduler), checked by greedy equality with a fresh engine loaded from the synced weights.

Run (on the GPU machine, SGLang on PYTHONPATH):
``python3 benchmarks/sglang_engine.py [--server-args '{"attention_backend": "triton"}']``.
Prints a markdown table and one ``SGLANG_BENCH_JSON`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPE = {"layers": 28, "hidden": 1024, "mlp": 3072, "heads": 16, "kv_heads": 8}
PROMPTS, PROMPT_LEN, NEW = 64, 128, 512
GROUP = 8
MEM = 0.5


def write_model(path: Path) -> Path:
    """Config + tokenizer only: SGLang makes random weights (dummy)."""
    from genrm_serve.testing import build_tiny_tokenizer

    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": SHAPE["hidden"],
        "intermediate_size": SHAPE["mlp"],
        "num_hidden_layers": SHAPE["layers"],
        "num_attention_heads": SHAPE["heads"],
        "num_key_value_heads": SHAPE["kv_heads"],
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    build_tiny_tokenizer().save_pretrained(str(path))
    return path


def prompt_ids(seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(10, 400) for _ in range(PROMPT_LEN)] for _ in range(PROMPTS)]


def base_args(model: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """What our engine sets (sglang_engine_kwargs + the prefill-graph switch), for the raw one."""
    return {
        "model_path": str(model),
        "load_format": "dummy",
        "mem_fraction_static": MEM,
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
        "cuda_graph_backend_prefill": "disabled",
        "dtype": "bfloat16",
        "context_length": PROMPT_LEN + NEW + 8,
        **extra,
    }


def raw_rollout(model: Path, extra: dict[str, Any]) -> dict[str, Any]:
    """Raw ``sgl.Engine.generate`` of the 64 prompts: a warm-up call, a timed call as SGLang is
    usually benchmarked (tokens only), and a timed call of the same workload as ours, which asks
    for each sampled token's log-prob (rollout keeps them for the importance-sampling
    correction): the baseline of the ratios."""
    import sglang

    eng = sglang.Engine(**base_args(model, extra))
    sp = {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True}
    calls = []
    for seed, logprobs in ((1, False), (2, False), (3, True)):
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=prompt_ids(seed), sampling_params=sp, return_logprob=logprobs)
        dt = time.perf_counter() - t0
        tokens = sum(int(o["meta_info"]["completion_tokens"]) for o in outs)
        calls.append({"s": dt, "tokens": tokens, "tok_s": tokens / dt, "logprobs": logprobs})
    eng.shutdown()
    return {"calls": calls, "tok_s": calls[-1]["tok_s"], "tok_s_no_logprobs": calls[1]["tok_s"]}


def spec(model: Path, extra: dict[str, Any]) -> Any:
    from genrm_serve.config import EngineConfig, InstanceSpec

    return InstanceSpec(
        route_key="rollout",
        model_path=str(model),
        num_gpus=1,
        engine="sglang",
        engine_config=EngineConfig(
            max_batch_size=GROUP * 4,
            max_context_len=PROMPT_LEN + NEW + 8,
            mem_fraction_static=MEM,
            server_args={"load_format": "dummy", **extra},
        ),
    )


def requests(ids: list[list[int]]) -> list[Any]:
    from genrm_client.types import SamplingParams
    from genrm_serve.config import DEFAULT_SAMPLING
    from genrm_serve.engines.base import EngineRequest

    sampling = SamplingParams(temperature=1.0, max_response_len=NEW).merged_over(DEFAULT_SAMPLING)
    return [EngineRequest(sampling=sampling, prompt_token_ids=p, return_tokens=True) for p in ids]


#: where partial results go after each stage (a run cut short keeps what it measured)
RESULTS: dict[str, Any] = {}
OUT_FILE: Path | None = None
FRESH_DIR = Path(tempfile.gettempdir()) / "q06b_synced"


def record(ours_part: dict[str, Any] | None = None) -> None:
    if ours_part is not None:
        RESULTS["ours"] = ours_part
    line = json.dumps(RESULTS, default=str)
    print("SGLANG_BENCH_JSON " + line, flush=True)
    if OUT_FILE is not None:
        OUT_FILE.write_text(line)


def model_path_of(s: Any) -> Path:
    return Path(s.model_path)


def exact_prompt(tokenizer: Any, seed: int) -> str:
    """A text that rl-core's rollout tokenises into exactly ``PROMPT_LEN`` ids (its special
    tokens included): the same prompt length as the other rows, so the same workload (a
    ``w123`` word is several tokens, and a longer prompt leaves fewer new tokens)."""
    import random

    rng = random.Random(seed)

    def n_ids(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=True)["input_ids"])

    words = [f"w{rng.randrange(0, 300)}" for _ in range(PROMPT_LEN)]
    while n_ids(" ".join(words)) > PROMPT_LEN:
        words.pop()
    text = " ".join(words)
    while n_ids(text) < PROMPT_LEN:
        text += "."
    if n_ids(text) != PROMPT_LEN:
        raise SystemExit(f"could not build a {PROMPT_LEN}-token prompt (seed {seed})")
    return text


async def via_rl_core(
    engine: Any, tokenizer: Any, settings: Any, seeds: tuple[int, ...]
) -> dict[str, Any]:
    """rl-core's rollout (``generate_groups``) of 8 groups of 8 samples of one prompt each, one
    call per seed; the last call is the figure."""
    from rl_core.engines import LocalEngineHandle
    from rl_core.rollout import generate_groups
    from rl_core.sample import Sample

    calls = []
    for seed in seeds:
        texts = [exact_prompt(tokenizer, seed * 1000 + g) for g in range(PROMPTS // GROUP)]
        groups = [
            [
                Sample(prompt=texts[g], label=None, metadata={}, group_id=g, index=i)
                for i in range(GROUP)
            ]
            for g in range(PROMPTS // GROUP)
        ]
        t0 = time.perf_counter()
        done = await generate_groups([LocalEngineHandle(engine)], groups, tokenizer, settings)
        dt = time.perf_counter() - t0
        tokens = sum(len(x.response_tokens) for g in done for x in g)
        calls.append({"s": dt, "tokens": tokens, "tok_s": tokens / dt})
    return {"calls": calls, "tok_s": calls[-1]["tok_s"]}


async def ours(model: Path, extra: dict[str, Any], weight_sync_too: bool = True) -> dict[str, Any]:
    from genrm_serve.engines.sglang import SGLangEngine
    from genrm_serve.engines.worker import EngineWorker
    from rl_core.rollout import RolloutSettings

    s = spec(model, extra)
    engine = SGLangEngine(s, "rollout/0")
    worker = EngineWorker(s, 0, engine=engine)
    await worker.start()
    out: dict[str, Any] = {"server_args": {k: str(v) for k, v in engine.server_args.items()}}

    async def via_worker(seed: int) -> tuple[float, int]:
        ids = prompt_ids(seed)
        groups = [requests(ids[i : i + GROUP]) for i in range(0, PROMPTS, GROUP)]
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(worker.generate_many(g) for g in groups))
        dt = time.perf_counter() - t0
        return dt, sum(o.completion_tokens for group in outs for o in group)

    calls = []
    for seed in (1, 2):
        dt, tokens = await via_worker(seed)
        calls.append({"s": dt, "tokens": tokens, "tok_s": tokens / dt})
    out["worker"] = {"calls": calls, "tok_s": calls[-1]["tok_s"]}

    tokenizer = engine.prompts.tokenizer if engine.prompts is not None else None
    settings = RolloutSettings(n_samples_per_prompt=GROUP, max_response_len=NEW)
    out["rl_core_rollout"] = await via_rl_core(engine, tokenizer, settings, (3, 4))
    record(out)
    # the same with each group's prompt computed ahead (as a judge batch is): what the
    # prefill-bound rule (PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN) saves a rollout
    policy = engine.warmup_policy
    engine.warmup_policy = dataclasses.replace(policy, max_new_per_prompt_token=None)
    try:
        out["rl_core_rollout_warmed"] = await via_rl_core(engine, tokenizer, settings, (5, 6))
    finally:
        engine.warmup_policy = policy
    out["rl_core_rollout_warmed"]["prefix_warmups"] = engine.counters["prefix_warmups"]
    # the worker again, now on an engine as warm as the rl-core rows found it: its first
    # figure comes from the engine's second call, and it moved 0.88-0.96x over three sessions
    calls = []
    for seed in (8, 9):
        dt, tokens = await via_worker(seed)
        calls.append({"s": dt, "tokens": tokens, "tok_s": tokens / dt})
    out["worker_warm"] = {"calls": calls, "tok_s": calls[-1]["tok_s"]}
    record(out)
    if not weight_sync_too:
        await worker.shutdown()
        return out
    sync = await weight_sync(engine)
    model, reqs, synced = sync.pop("model"), sync.pop("requests"), sync.pop("greedy_after_sync")
    out["weight_sync"] = sync
    record(out)
    await worker.shutdown()
    fresh = await fresh_greedy(model, reqs, extra, model_dir=model_path_of(s), where=FRESH_DIR)
    sync["greedy_equal_to_a_fresh_engine"] = fresh == synced
    record(out)
    return out


async def weight_sync(engine: Any) -> dict[str, Any]:
    """SGLang's own update of the same bf16 tensors, then ours through IPC buckets."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from genrm_serve.engines.weights import ipc_handle, pack_bucket, plan_buckets

    cfg = AutoConfig.from_pretrained(engine.spec.model_path)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    named = dict(model.named_parameters())
    nbytes = sum(p.numel() * 2 for p in named.values())
    sgl, thread = engine.sgl, engine._thread
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    await thread.call(lambda: sgl.update_weights_from_tensor(list(named.items())))
    raw_s = time.perf_counter() - t0
    with torch.no_grad():
        for p in named.values():
            p.add_(1.0 / 64)  # new values, exactly representable steps in bf16
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    buckets = plan_buckets(named.items())
    flats = [pack_bucket(b, named) for b in buckets]
    torch.cuda.synchronize()
    await engine.update_weights_from_ipc(
        [(b, ipc_handle(f)) for b, f in zip(buckets, flats, strict=True)], version=1
    )
    ours_s = time.perf_counter() - t0
    # read-back: greedy outputs against a fresh engine loaded from these weights (SGLang
    # 0.5.17 has no get_weights_by_name for Qwen3)
    reqs = requests(prompt_ids(7)[:8])
    for r in reqs:
        r.sampling = r.sampling.model_copy(update={"temperature": 0.0, "max_response_len": 16})
    synced = [o.token_ids for o in await engine.generate(reqs)]
    return {
        "gib": nbytes / 2**30,
        "tensors": len(named),
        "buckets": len(buckets),
        "sglang_update_weights_from_tensor_s": raw_s,
        "ours_ipc_s": ours_s,
        "model": model,
        "greedy_after_sync": synced,
        "requests": reqs,
    }


async def fresh_greedy(
    model: Any, reqs: list[Any], extra: dict[str, Any], *, model_dir: Path, where: Path
) -> Any:
    """Greedy outputs of an engine started from ``model``'s weights saved to ``where`` (with
    ``model_dir``'s tokenizer)."""
    import shutil

    from genrm_serve.engines.sglang import SGLangEngine

    def save() -> None:
        model.save_pretrained(str(where))
        for f in model_dir.iterdir():
            if "token" in f.name:
                shutil.copy(f, where / f.name)

    await asyncio.to_thread(save)
    s = spec(where, extra)
    s = s.model_copy(
        update={
            "engine_config": s.engine_config.model_copy(
                update={"server_args": dict(extra)}  # real weights: no dummy load
            )
        }
    )
    engine = SGLangEngine(s, "fresh/0")
    await engine.start()
    try:
        return [o.token_ids for o in await engine.generate(reqs)]
    finally:
        await engine.shutdown()


def main() -> None:
    global OUT_FILE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server-args", default="{}", help="JSON: SGLang server args for both")
    ap.add_argument("--out", default=None, help="write the JSON here too (after each stage)")
    ap.add_argument("--no-weight-sync", action="store_true", help="the rollout rows only")
    args = ap.parse_args()
    OUT_FILE = Path(args.out) if args.out else None
    extra = json.loads(args.server_args)
    # Ray before SGLang: an SGLang install that stubs IPython (the GPU machine's trimmed one)
    # leaves a module Ray's logging then takes for a notebook (ImportError: get_ipython)
    import ray  # noqa: F401

    model = write_model(Path(tempfile.mkdtemp(prefix="q06b_")))
    RESULTS["raw"] = raw_rollout(model, extra)
    record()
    asyncio.run(ours(model, extra, weight_sync_too=not args.no_weight_sync))
    raw = RESULTS["raw"]["tok_s"]
    plain = RESULTS["raw"]["tok_s_no_logprobs"]
    print("| path | tokens/s (second call) | vs raw |\n|---|---|---|")
    print(f"| raw sgl.Engine.generate, tokens only | {plain:,.0f} | {plain / raw:.2f}x |")
    print(f"| raw sgl.Engine.generate, with log-probs (our workload) | {raw:,.0f} | 1.00x |")
    for key, label in (
        ("worker", "ours, engine worker"),
        ("worker_warm", "ours, engine worker, again after the rl-core rows"),
        ("rl_core_rollout", "ours, rl-core"),
        ("rl_core_rollout_warmed", "ours, rl-core, each group's prompt computed ahead"),
    ):
        tok_s = RESULTS["ours"][key]["tok_s"]
        print(f"| {label} | {tok_s:,.0f} | {tok_s / raw:.2f}x |")
    ws = RESULTS["ours"].get("weight_sync")
    if ws is None:
        return
    print(
        f"\nweight sync ({ws['gib']:.2f} GiB bf16, {ws['tensors']} tensors): SGLang's "
        f"update_weights_from_tensor {ws['sglang_update_weights_from_tensor_s']:.3f} s; ours "
        f"(pack {ws['buckets']} buckets + IPC) {ws['ours_ipc_s']:.3f} s; greedy equal to a "
        f"fresh engine loaded from the synced weights: {ws['greedy_equal_to_a_fresh_engine']}"
    )


if __name__ == "__main__":
    main()
