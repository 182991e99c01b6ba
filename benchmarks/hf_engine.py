"""The transformers engine next to plain transformers, same process, same weights.

Two workloads, each printed as a table with the ratio to its baseline:

* ``judge``: GRPO-shaped judge batches — ``--groups`` groups of ``--group-size`` samples, each
  prompt ``--shared`` tokens common to its group then ``--private`` tokens of its own, groups
  differing from their first token; one output token (greedy). ``HFEngine.generate`` on the whole
  batch against one batched forward of the same prompts (``logits_to_keep=1``) — and the same
  with every prompt distinct (no prefix to share). Prompts are token ids, random weights.
* ``rollout``: ``--prompts`` prompts of ``--prompt-tokens`` tokens, ``--new-tokens`` sampled at
  T = 1 for every row (end-of-sequence disabled on both sides), tokens/s of ``HFEngine.generate``
  against ``model.generate``.

``--shape`` picks the model: ``qwen3-4b`` (36 × 2560, MLP 9728, 32 / 8 heads, head_dim 128,
vocab 151,936), ``qwen3-0.6b`` (28 × 1024, MLP 3072, 16 / 8 heads), ``tiny`` (for a smoke run
on CPU), or ``--model PATH|embedded`` for a real model folder (its own tokenizer; the prompts are
still random token ids below its vocabulary). Random-weight models are built in memory in bf16 on
a GPU (fp32 on CPU)::

    python benchmarks/hf_engine.py judge --shape qwen3-4b
    python benchmarks/hf_engine.py rollout --shape qwen3-0.6b
    python benchmarks/hf_engine.py judge --model embedded --shared 200 --private 50 --repeats 2

``--engine-module FILE`` loads ``HFEngine`` from another copy of ``engines/hf/engine.py`` (e.g. an
older commit's, via ``git show REV:packages/genrm-serve/src/genrm_serve/engines/hf/engine.py >
old.py``; ``engines/hf.py`` before the engine became a package), so that two versions are
compared on one machine in one run; the copy imports its helper modules from the installed tree.
Each row also reports judgments per CPU-second of this process, which is what matters on a
shared CPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from genrm_client.types import SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineRequest
from genrm_serve.testing import build_tiny_tokenizer

SHAPES: dict[str, dict[str, int]] = {
    "qwen3-4b": dict(
        num_hidden_layers=36,
        hidden_size=2560,
        intermediate_size=9728,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "qwen3-0.6b": dict(
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    ),
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
    ),
}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(
    fn: Callable[[], Any], repeats: int, warm_up: Callable[[], Any] | None = None
) -> tuple[float, float, Any]:
    """Median wall seconds and mean CPU seconds of ``repeats`` calls after one warm-up call
    (of ``fn`` itself unless ``warm_up`` is given)."""
    result = (warm_up or fn)()
    _sync()
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), _cpu_s()
        result = fn()
        _sync()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu_s() - c0)
    return statistics.median(walls), statistics.mean(cpus), result


def _load_engine_class(path: str | None) -> Any:
    if path is None:
        from genrm_serve.engines.hf import HFEngine

        return HFEngine
    spec = importlib.util.spec_from_file_location("genrm_bench_engine", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.HFEngine


def _random_model_dir(shape: str, device: torch.device) -> tuple[Path, Any]:
    """A folder with a tokenizer + config, and the random-weight model built in memory."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = build_tiny_tokenizer()
    cfg = Qwen3Config(
        **SHAPES[shape],
        max_position_embeddings=40960,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    folder = Path(tempfile.mkdtemp(prefix="genrm-bench-"))
    cfg.save_pretrained(folder)
    tok.save_pretrained(folder)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return folder, model.eval()


def _engine(args: argparse.Namespace, max_context: int) -> Any:
    """A started engine (random weights adopted in memory, or a real model folder)."""
    cls = _load_engine_class(args.engine_module)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    prebuilt = None
    if args.model:
        model_path = args.model
    else:
        folder, prebuilt = _random_model_dir(args.shape, device)
        model_path = str(folder)

    class Engine(cls):  # type: ignore[misc, valid-type]
        def _load_model(self, path: Path) -> Any:
            if prebuilt is None:
                return super()._load_model(path)
            # The engine's own loader would set these; an older engine reads ``_cache_kw``.
            params = inspect.signature(prebuilt.forward).parameters
            self._cache_kw = "cache" if "cache" in params else "past_key_values"
            if args.engine_module is None:
                from genrm_serve.engines.hf.packing import register_attention

                prebuilt.set_attn_implementation(register_attention())
                self._compile(prebuilt)
            return prebuilt

    spec = InstanceSpec(
        route_key="bench",
        model_path=model_path,
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(max_batch_size=64, max_context_len=max_context),
    )
    engine = Engine(spec, "bench/0")
    asyncio.run(engine.start())
    return engine


def _judge_prompts(
    groups: int, size: int, shared: int, private: int, vocab: int, distinct: bool
) -> list[list[int]]:
    """Token-id prompts; groups (or, ``distinct``, all prompts) differ from the first token."""
    gen = torch.Generator().manual_seed(1)
    prompts = []
    first = torch.randperm(vocab - 10, generator=gen)[: groups * size] + 10
    for g in range(groups):
        head = torch.randint(10, vocab, (shared,), generator=gen)
        for s in range(size):
            tail = torch.randint(10, vocab, (private,), generator=gen)
            p = torch.cat([head, tail])
            p[0] = first[g * size + s] if distinct else first[g]
            prompts.append(p.tolist())
    return prompts


def _requests(prompts: list[list[int]], **sampling: Any) -> list[EngineRequest]:
    params = SamplingParams(**sampling).merged_over(DEFAULT_SAMPLING)
    return [EngineRequest(sampling=params, prompt_token_ids=p, return_tokens=True) for p in prompts]


class _eager:
    """The model as plain transformers runs it: the engine's compiled layers set aside."""

    def __init__(self, model: Any) -> None:
        self.layers = list(getattr(model.model, "layers", []))
        self.saved: list[Any] = []

    def __enter__(self) -> None:
        self.saved = [getattr(layer, "_compiled_call_impl", None) for layer in self.layers]
        for layer in self.layers:
            layer._compiled_call_impl = None

    def __exit__(self, *exc: object) -> None:
        for layer, impl in zip(self.layers, self.saved, strict=True):
            layer._compiled_call_impl = impl


def _plain_forward(model: Any, prompts: list[list[int]]) -> Callable[[], torch.Tensor]:
    """One batched forward of equal-length prompts, logits at the last position only."""
    ids = torch.tensor(prompts, device=model.device)

    @torch.inference_mode()
    def run() -> torch.Tensor:
        with _eager(model):
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]
        return logits.argmax(-1).cpu()

    return run


def _print_row(name: str, n: int, wall: float, cpu: float, base: float | None) -> None:
    ratio = f"{base / wall:.2f}x" if base else "-"
    print(f"| {name} | {n / wall:.1f} | {n / cpu:.2f} | {wall * 1e3:.0f} | {ratio} |", flush=True)


def judge(args: argparse.Namespace) -> None:
    engine = _engine(args, args.shared + args.private + 8)
    model = engine.model
    vocab = int(model.config.vocab_size)
    n = args.groups * args.group_size
    print(
        f"judge: device={engine.device} dtype={engine.dtype} shape={args.model or args.shape} "
        f"{args.groups} groups x {args.group_size}, {args.shared} shared + {args.private} "
        f"private tokens, 1 output token"
    )
    print("| path | judgments/s | judgments/CPU-s | ms per batch | vs plain |")
    print("|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        prompts = _judge_prompts(
            args.groups, args.group_size, args.shared, args.private, vocab, kind == "distinct"
        )
        plain_wall, plain_tokens = None, None
        if not args.no_plain:
            plain_wall, plain_cpu, plain_tokens = _timed(
                _plain_forward(model, prompts), args.repeats
            )
            _print_row(
                f"{kind}: plain transformers, one batched forward", n, plain_wall, plain_cpu, None
            )
        reqs = _requests(prompts, temperature=0.0, max_response_len=1)
        shared_before = engine.counters.get("prefix_shared_tokens", 0)

        def run_engine(reqs: list[EngineRequest] = reqs) -> list[Any]:
            return asyncio.run(engine.generate(reqs))

        wall, cpu, outs = _timed(run_engine, args.repeats)
        calls = args.repeats + 1
        shared = (engine.counters.get("prefix_shared_tokens", 0) - shared_before) // calls
        _print_row(
            f"{kind}: HFEngine.generate ({shared} prompt tokens shared)", n, wall, cpu, plain_wall
        )
        if plain_tokens is not None:
            agree = sum(
                int(o.token_ids[0] == int(t))
                for o, t in zip(outs, plain_tokens.tolist(), strict=True)
            )
            print(f"|   greedy token equal to plain on {agree}/{n} rows | | | | |", flush=True)
        if args.profile and kind == "grouped":
            _profile(lambda r=reqs: engine._generate(r), args.profile)  # this thread: CPU ops too
    _footer(engine)


def _profile(fn: Callable[[], Any], path: str) -> None:
    """Where one call's time goes: by operator (the table also goes to ``path``), and on a GPU
    where the device waited for the host (traces ``path``.json, and ``path``.stack.json taken
    with Python frames, which slow the host: its gaps are larger, their places the same)."""
    from torch.profiler import ProfilerActivity, profile
    from trace_gaps import summarize

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
        _sync()
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=40)
    Path(path).write_text(table)
    print("\n".join(table.splitlines()[:30]))
    if not torch.cuda.is_available():
        return
    prof.export_chrome_trace(f"{path}.json")
    print(summarize(Path(f"{path}.json"), top=3))
    with profile(activities=activities, with_stack=True) as prof:
        fn()
        _sync()
    prof.export_chrome_trace(f"{path}.stack.json")
    print(summarize(Path(f"{path}.stack.json"), top=20))


def rollout(args: argparse.Namespace) -> None:
    engine = _engine(args, args.prompt_tokens + args.new_tokens + 8)
    model = engine.model
    engine._eos_ids = frozenset()  # every row runs its full length, as in the baseline
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(2)
    prompts = torch.randint(10, vocab, (args.prompts, args.prompt_tokens), generator=gen)
    total = args.prompts * args.new_tokens
    print(
        f"rollout: device={engine.device} dtype={engine.dtype} shape={args.model or args.shape} "
        f"{args.prompts} prompts x {args.prompt_tokens} tokens, {args.new_tokens} new at T=1"
    )
    print("| path | tokens/s | tokens/CPU-s | s per batch | vs model.generate |")
    print("|---|---|---|---|---|")
    ids = prompts.to(model.device)

    @torch.inference_mode()
    def hf_generate() -> torch.Tensor:
        with _eager(model):
            return _generate()

    def _generate(new_tokens: int = args.new_tokens) -> torch.Tensor:
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        return out[:, ids.shape[1] :].cpu()

    def warm_up() -> None:
        with _eager(model), torch.inference_mode():
            _generate(8)

    # Its first full call and its second: the first pays one-off costs per new key length (on
    # an H200 with torch 2.11, cuDNN attention plans), the second is the warmed baseline.
    base_wall, base_cpu, out = _timed(hf_generate, 1, warm_up)
    assert out.shape == (args.prompts, args.new_tokens), out.shape
    warm_wall, warm_cpu, _ = _timed(hf_generate, 1, lambda: None)
    for name, w, c in (("first", base_wall, base_cpu), ("second", warm_wall, warm_cpu)):
        print(
            f"| model.generate ({name} full call) | {total / w:.0f} | {total / c:.0f} | {w:.2f} | "
            f"{base_wall / w:.2f}x |",
            flush=True,
        )
    reqs = _requests(
        prompts.tolist(), temperature=1.0, top_p=1.0, top_k=-1, max_response_len=args.new_tokens
    )

    def run_engine() -> list[Any]:
        return asyncio.run(engine.generate(reqs))

    wall, cpu, outs = _timed(run_engine, args.repeats)
    assert all(o.completion_tokens == args.new_tokens for o in outs)
    print(
        f"| HFEngine.generate | {total / wall:.0f} | {total / cpu:.0f} | {wall:.2f} | "
        f"{base_wall / wall:.2f}x (vs the second call: {warm_wall / wall:.2f}x) |",
        flush=True,
    )
    # The sampled tokens' log-probs against one full forward of prompt + response (TIS needs them).
    row = outs[0]
    full = torch.tensor([reqs[0].prompt_token_ids + row.token_ids], device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=full, use_cache=False).logits[0, args.prompt_tokens - 1 : -1]
    ref = torch.log_softmax(logits.float(), -1).gather(1, full[0, args.prompt_tokens :, None])[:, 0]
    err = (ref.cpu() - torch.tensor(row.raw_logprobs)).abs()
    print(f"raw log-prob vs one full forward, row 0: max |diff| {err.max():.3g}, {err.mean():.3g}")
    _footer(engine)


def _footer(engine: Any) -> None:
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if engine.device.type == "cuda":
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=["judge", "rollout"])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--model", default=None, help="a model folder or 'embedded' (not --shape)")
    ap.add_argument("--engine-module", default=None, help="HFEngine from this file instead")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", default=None, help="judge: write an operator profile here")
    ap.add_argument("--kinds", default="grouped,distinct", help="judge: prompt sets to run")
    ap.add_argument("--no-plain", action="store_true", help="judge: skip plain transformers")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--shared", type=int, default=550)
    ap.add_argument("--private", type=int, default=150)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=512)
    args = ap.parse_args()
    {"judge": judge, "rollout": rollout}[args.workload](args)


if __name__ == "__main__":
    main()
