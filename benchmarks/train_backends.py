"""One GRPO training step, torch backend vs Megatron-core backend, same weights, same batch.

A Qwen3-1.7B-shaped policy (28 layers × 2048, MLP 6144, 16 query / 8 KV heads of 128, vocab
151,936, tied embeddings) with random weights, saved once as an HF checkpoint; both backends load
it in the same process, one after the other, and train on the same 8 × 2048-token batch (256
prompt + 1,792 response tokens each, advantages ±1): bf16 autocast over fp32 master weights,
AdamW, one micro-batch of 16,384 tokens. Reported per backend: seconds per ``train_step``
(median of ``--steps`` after one warm-up step), tokens/s, peak GPU memory, and the ratio
Megatron / torch measured in this run.

    python benchmarks/train_backends.py                     # on one GPU
    python benchmarks/train_backends.py --tiny --device cpu  # a smoke run of the script itself
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from rl_core.backends.base import BackendConfig, TrainingBackend, TrainItem

QWEN3_1_7B = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
TINY = {
    **QWEN3_1_7B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1024,
}


def write_checkpoint(shape: dict[str, Any], path: Path, device: str) -> Path:
    """Random weights of the shape, saved in bf16 (the backends keep fp32 masters)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(**shape)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    return path


def make_batch(
    n: int, length: int, prompt: int, vocab: int, ragged: bool = False
) -> list[TrainItem]:
    """``n`` sequences of ``length`` tokens, or with ``ragged`` of lengths spread evenly from
    ``length / 4`` to ``length`` (as RL responses are: the torch backend pads to the longest)."""
    g = torch.Generator().manual_seed(1)
    lengths = [length] * n
    if ragged:
        lengths = [length // 4 + (length - length // 4) * i // max(1, n - 1) for i in range(n)]
    return [
        TrainItem(
            tokens=torch.randint(0, vocab, (lengths[i],), generator=g).tolist(),
            response_start=prompt,
            advantage=1.0 if i % 2 else -1.0,
            in_loss=True,
        )
        for i in range(n)
    ]


def build(name: str, path: Path, cfg: BackendConfig, device: str) -> TrainingBackend:
    if name == "torch":
        from rl_core.backends.torch_hf import TorchHFBackend

        return TorchHFBackend(path, cfg, device=device)
    from rl_core.backends.megatron.backend import MegatronBackend

    return MegatronBackend(path, cfg, device=device)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def write_profile(backend: TrainingBackend, items: list[TrainItem], device: str, out: Path) -> None:
    """One more step under torch's profiler: the operators by device time, and how much of the
    step's wall time the device was busy (host-bound steps show a low share)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        backend.train_step(items, old_logprobs=None)
        sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    # kernels only: an operator's row also carries the device time of the kernels it launched
    busy = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / 1e6
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"wall {wall:.3f} s (profiled), device busy {busy:.3f} s\n"
        + events.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=70)
    )
    print(f"profile of {out.stem}: wall {wall:.3f} s, device busy {busy:.3f} s -> {out}")


def measure(
    name: str,
    path: Path,
    cfg: BackendConfig,
    items: list[TrainItem],
    steps: int,
    device: str,
    profile: Path | None = None,
) -> dict[str, Any]:
    backend = build(name, path, cfg, device)
    tokens = sum(len(it.tokens) for it in items)
    backend.train_step(items, old_logprobs=None)  # warm-up: kernels, optimizer state
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        metrics = backend.train_step(items, old_logprobs=None)
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    if profile is not None:
        write_profile(backend, items, device, profile / f"{name}.txt")
    step_s = statistics.median(times)
    result = {
        "backend": name,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "peak_gib": peak,
        "loss": metrics["loss"],
        "grad_norm": metrics["grad_norm"],
    }
    close = getattr(backend, "close", None)
    del backend
    if close is not None:
        close()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--backends", default="torch,megatron")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens-per-gpu", type=int, default=16384)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke run)")
    p.add_argument("--ragged", action="store_true", help="lengths from seq-len / 4 to seq-len")
    p.add_argument("--checkpoint", type=Path, help="reuse this HF folder instead of writing one")
    p.add_argument("--profile", type=Path, help="write a profile of one more step per backend here")
    args = p.parse_args()

    shape = TINY if args.tiny else QWEN3_1_7B
    bf16 = args.device.startswith("cuda")
    cfg = BackendConfig(
        lr=1e-6,
        weight_decay=0.1,
        bf16=bf16,
        max_tokens_per_micro_batch=args.max_tokens_per_gpu,
        logprob_chunk_size=1024 if bf16 else 256,
    )
    items = make_batch(
        args.batch, args.seq_len, args.prompt_len, shape["vocab_size"], ragged=args.ragged
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or write_checkpoint(shape, Path(tmp) / "policy", args.device)
        results = [
            measure(name, path, cfg, items, args.steps, args.device, args.profile)
            for name in args.backends.split(",")
        ]
    print(f"{'backend':<10} {'step s':>8} {'tokens/s':>10} {'peak GiB':>9} {'loss':>10}")
    for r in results:
        print(
            f"{r['backend']:<10} {r['step_s']:>8.3f} {r['tokens_per_s']:>10.0f} "
            f"{r['peak_gib'] if r['peak_gib'] is not None else float('nan'):>9.1f} "
            f"{r['loss']:>10.5f}"
        )
    by = {r["backend"]: r for r in results}
    if "torch" in by and "megatron" in by:
        ratio = by["megatron"]["tokens_per_s"] / by["torch"]["tokens_per_s"]
        print(f"megatron / torch tokens/s: {ratio:.2f}x")
    shape_name = "tiny" if args.tiny else "qwen3-1.7b"
    print(json.dumps({"shape": shape_name, "ragged": args.ragged, "results": results}))


if __name__ == "__main__":
    main()
