"""Memory handoff and weight sync on one GPU: judge sleep / wake, trainer offload / onload, and a
policy's weights handed to a colocated engine process through CUDA IPC.

Three measurements, random weights of real shapes, bf16 engines (needs a CUDA GPU):

1. **judge sleep / wake** (Qwen3-4B shape: 36 × 2560, MLP 9728, 32 / 8 heads, head dim 128,
   vocab 151,936) in genrm-serve's hf engine at ``mem_fraction_static`` 0.3: greedy outputs
   before and after, GPU memory awake / asleep / woken (``mem_get_info``), seconds of each sleep
   and wake (the first sleep allocates and pins the host buffers; later ones reuse them). Also:
   an engine whose weights exceed its fraction fails at start, naming fraction and sizes.
2. **trainer offload / onload** (Qwen3-0.6B shape, fp32 weights + AdamW state after one
   step): seconds, and whether the host buffers are the same memory on the second offload.
3. **weight sync through CUDA IPC** (Qwen3-0.6B shape): the trainer's rank (this process) packs
   bf16 buckets, an engine in another process on the same GPU (``torch.multiprocessing``, spawn)
   copies them; seconds per sync, the engine's weights against the trainer's cast to bf16, and
   the engine's next greedy output against the trainer model's.

Run: ``python benchmarks/gpu_handoff.py`` (``--quick`` for small shapes, e.g. to check the
script on a small GPU). Prints a markdown report; ``--json PATH`` writes the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import queue
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

JUDGE_4B = {"layers": 36, "hidden": 2560, "mlp": 9728, "heads": 32, "kv_heads": 8}
POLICY_06B = {"layers": 28, "hidden": 1024, "mlp": 3072, "heads": 16, "kv_heads": 8}
QUICK = {"layers": 2, "hidden": 256, "mlp": 512, "heads": 4, "kv_heads": 2}
GB = 1e9


def gpu_used_gb() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GB


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(10, 500, (length,), generator=g).tolist() for _ in range(n)]


def requests(ids: list[list[int]], new_tokens: int) -> list[Any]:
    from genrm_client.types import SamplingParams
    from genrm_serve.config import DEFAULT_SAMPLING
    from genrm_serve.engines.base import EngineRequest

    sampling = SamplingParams(temperature=0.0, max_response_len=new_tokens).merged_over(
        DEFAULT_SAMPLING
    )
    return [EngineRequest(sampling=sampling, prompt_token_ids=p, return_tokens=True) for p in ids]


def engine_spec(path: Path, fraction: float | None, sleep_buffers: str = "first_sleep") -> Any:
    from genrm_serve.config import EngineConfig, InstanceSpec

    return InstanceSpec(
        route_key="bench",
        model_path=str(path),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(
            max_batch_size=64,
            max_context_len=4096,
            mem_fraction_static=fraction,
            sleep_buffers=sleep_buffers,  # type: ignore[arg-type]
        ),
    )


def weight_fingerprint(model: Any, *, params_only: bool = False) -> list[int]:
    """Exact per-tensor integer sums of the raw bits: equal iff (almost surely) bit-identical."""
    out = []
    if isinstance(model, list):
        tensors = model
    else:
        tensors = list(model.parameters()) + ([] if params_only else list(model.buffers()))
    for t in tensors:
        bits = t.detach().contiguous().view(-1)
        bits = bits.view(torch.int16) if t.element_size() == 2 else bits.view(torch.int32)
        out.append(int(bits.to(torch.int64).sum()))
    return out


# --- 1. judge sleep / wake ----------------------------------------------------------------------


async def judge_sleep_wake(
    path: Path, rounds: int, small: Path, sleep_buffers: str = "first_sleep"
) -> dict[str, Any]:
    from genrm_serve.engines.base import EngineError
    from genrm_serve.engines.hf import HFEngine

    out: dict[str, Any] = {}
    try:  # weights larger than the share: refused at start, before the device is touched
        await HFEngine(engine_spec(small, 0.005), "bench/small-share").start()
        out["small_share_error"] = None
    except EngineError as err:
        out["small_share_error"] = str(err)
    torch.cuda.empty_cache()

    base = gpu_used_gb()
    engine = HFEngine(engine_spec(path, 0.3, sleep_buffers), "bench/0")
    out["sleep_buffers"] = sleep_buffers
    t0 = time.perf_counter()
    await engine.start()
    out["load_s"] = time.perf_counter() - t0
    out["budget"] = dict(engine.memory_budget)
    reqs = requests(prompts(8, 256, seed=1), 16)
    before = [o.token_ids for o in await engine.generate(reqs)]
    # the engine's own repeatability, without any sleep (a baseline for the comparison below)
    out["greedy_repeatable_awake"] = [o.token_ids for o in await engine.generate(reqs)] == before
    fingerprint = weight_fingerprint(engine.model)
    out["gpu_awake_gb"] = gpu_used_gb()
    out["gpu_before_engine_gb"] = base
    sleeps, wakes, asleep, woken, same, exact = [], [], [], [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await engine.sleep()
        sleeps.append(time.perf_counter() - t0)
        asleep.append(gpu_used_gb())
        t0 = time.perf_counter()
        await engine.wake()
        wakes.append(time.perf_counter() - t0)
        woken.append(gpu_used_gb())
        exact.append(weight_fingerprint(engine.model) == fingerprint)
        after = [o.token_ids for o in await engine.generate(reqs)]
        same.append(after == before)
    assert engine._host is not None
    out |= {
        "sleep_s": sleeps,
        "wake_s": wakes,
        "gpu_asleep_gb": asleep,
        "gpu_woken_gb": woken,
        "greedy_identical": same,
        "weights_bit_identical": exact,
        "host_buffer_gb": engine._host.host_bytes / GB,
    }
    await engine.shutdown()
    del engine
    torch.cuda.empty_cache()
    return out


# --- 2. trainer offload / onload ----------------------------------------------------------------


def trainer_backend(path: Path) -> Any:
    from rl_core.backends.base import BackendConfig, TrainItem
    from rl_core.backends.torch_hf import TorchHFBackend

    backend = TorchHFBackend(path, BackendConfig(lr=1e-3, bf16=True), device="cuda")
    g = torch.Generator().manual_seed(3)
    items = [
        TrainItem(
            tokens=torch.randint(10, 500, (192,), generator=g).tolist(),
            response_start=128,
            advantage=1.0 if i % 2 else -1.0,
            in_loss=True,
        )
        for i in range(8)
    ]
    backend.train_step(items, old_logprobs=None)  # Adam state exists from here on
    return backend


def offload_onload(backend: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"gpu_trainer_gb": gpu_used_gb()}
    times: list[dict[str, float]] = []
    ptrs = []
    for _ in range(3):
        t0 = time.perf_counter()
        backend.offload()
        off = time.perf_counter() - t0
        ptrs.append(backend._host.buffer(next(iter(backend.offload_tensors()))).data_ptr())
        out["gpu_offloaded_gb"] = gpu_used_gb()
        t0 = time.perf_counter()
        backend.onload()
        times.append({"offload_s": off, "onload_s": time.perf_counter() - t0})
    out["moves"] = times
    out["host_buffers_reused"] = len(set(ptrs)) == 1
    out["host_buffer_gb"] = backend._host.host_bytes / GB
    return out


# --- 3. weight sync through CUDA IPC ------------------------------------------------------------


def _engine_process(path: str, inbox: Any, outbox: Any) -> None:
    """The colocated engine: loads the policy, then applies what the trainer sends."""
    from genrm_serve.engines.hf import HFEngine

    async def serve() -> None:
        engine = HFEngine(engine_spec(Path(path), None), "rollout/0")
        await engine.start()
        outbox.put(("ready", None))
        while True:
            msg, payload = inbox.get()
            if msg == "bucket":
                bucket, version, done = payload
                await engine.update_weights_from_ipc([bucket], version, done)
                outbox.put(("ok", engine.weight_version))
            elif msg == "generate":
                outs = await engine.generate(requests(payload, 16))
                outbox.put(("tokens", [o.token_ids for o in outs]))
            elif msg == "fingerprint":
                outbox.put(("fingerprint", weight_fingerprint(engine.model, params_only=True)))
            else:
                await engine.shutdown()
                outbox.put(("bye", None))
                return

    asyncio.run(serve())


def greedy_reference(
    backend: Any, path: Path, ids: list[list[int]], new_tokens: int
) -> list[list[int]]:
    """The trainer model's greedy continuation through the same engine code: its weights cast to
    bf16, saved, loaded by an hf engine in this process, the same batch. Not ``model.generate``:
    with random weights near-ties are common, and another kernel order (batch of one, another
    attention path) flips some of them, which says nothing about the sync."""
    from transformers import AutoTokenizer

    from genrm_serve.engines.hf import HFEngine

    model = backend.model
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
        model.save_pretrained(tmp, state_dict=bf16)
        model.generation_config.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(path).save_pretrained(tmp)
        del bf16

        async def run() -> list[list[int]]:
            engine = HFEngine(engine_spec(Path(tmp), None), "reference/0")
            await engine.start()
            outs = [o.token_ids for o in await engine.generate(requests(ids, new_tokens))]
            await engine.shutdown()
            return outs

        outs = asyncio.run(run())
    torch.cuda.empty_cache()
    return outs


#: A greedy token counts as the trainer's choice if its logit is within this of the trainer's
#: maximum: the engine runs another kernel order (packed prefill, KV-cached decode), and bf16
#: logits of random weights carry ~1e-2 of rounding, so exact ties cannot be told apart.
NEAR_TIE = 0.05


def greedy_agreement(
    backend: Any, ids: list[list[int]], outs: list[list[int]]
) -> dict[str, float | int]:
    """How the engine's greedy tokens score under the trainer's own model (its bf16 cast),
    teacher-forced on prompt + engine output: the count whose token is the trainer's argmax, the
    count within ``NEAR_TIE`` of it, and the largest gap. An engine that did not take the new
    weights scores far off (a gap of whole logits), which the check before the sync shows."""
    model = backend.model
    exact = near = total = 0
    worst = 0.0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for prompt, out in zip(ids, outs, strict=True):
            seq = torch.tensor([prompt + out], device="cuda")
            logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1].float()
            chosen = logits.gather(-1, torch.tensor(out, device="cuda").unsqueeze(-1))[:, 0]
            gap = logits.max(-1).values - chosen
            exact += int((logits.argmax(-1) == torch.tensor(out, device="cuda")).sum())
            near += int((gap <= NEAR_TIE).sum())
            total += len(out)
            worst = max(worst, float(gap.max()))
    return {"tokens": total, "argmax_equal": exact, "within_near_tie": near, "max_gap": worst}


def ipc_sync(path: Path, backend: Any, syncs: int, bucket_mb: int) -> dict[str, Any]:
    from rl_core.distributed.worker import TrainWorker

    worker = TrainWorker("actor", 0, 1, str(path), backend.cfg, device="cuda")
    worker.backend = backend  # the rank's weight methods on this process's backend (no Ray)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_engine_process, args=(str(path), inbox, outbox))
    proc.start()

    def reply() -> Any:
        """The engine's next answer; fails at once (not at a timeout) if the process died."""
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                return outbox.get(timeout=1.0)
            except queue.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"engine process exited ({proc.exitcode})") from None
        raise TimeoutError("engine process did not answer in 600 s")

    assert reply()[0] == "ready"
    ids = prompts(4, 64, seed=5)
    inbox.put(("generate", ids))
    engine_before = reply()[1]
    times = []
    buckets = 0
    for version in range(1, syncs + 1):
        with torch.no_grad():  # a training step's worth of change
            for p in backend.model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        metas = worker.weight_buckets(bucket_mb << 20, "bfloat16")
        buckets = len(metas)
        for i in range(len(metas)):
            bucket = worker.export_bucket_ipc(i)
            inbox.put(("bucket", (bucket, version, i == len(metas) - 1)))
            msg, served = reply()
            assert msg == "ok", msg
        worker.release_ipc()
        times.append(time.perf_counter() - t0)
        assert served == version, (served, version)
    inbox.put(("fingerprint", None))
    engine_bits = reply()[1]
    trainer_bits = weight_fingerprint(
        [p.detach().to(torch.bfloat16) for _, p in backend.named_weights()]
    )
    inbox.put(("generate", ids))
    engine_after = reply()[1]
    agreement = greedy_agreement(backend, ids, engine_after)
    stale = greedy_agreement(backend, ids, engine_before)  # the check can fail: old weights
    reference = greedy_reference(backend, path, ids, 16)
    inbox.put(("stop", None))
    reply()
    proc.join(60)
    return {
        "sync_s": times,
        "buckets": buckets,
        "bucket_mb": bucket_mb,
        "weights_gb_bf16": sum(p.numel() for _, p in backend.named_weights()) * 2 / GB,
        "weights_equal_trainer_bf16": engine_bits == trainer_bits,
        "greedy_equals_trainer": engine_after == reference,
        "greedy_vs_trainer_model": agreement,
        "greedy_before_sync_vs_trainer_model": stale,
        "greedy_changed_by_sync": engine_after != engine_before,
        "weight_version": served,
    }


def agree(a: dict[str, Any]) -> str:
    return (
        f"{a['argmax_equal']}/{a['tokens']} greedy tokens are the trainer's argmax, "
        f"{a['within_near_tie']}/{a['tokens']} within {NEAR_TIE} of it (largest gap "
        f"{a['max_gap']:.3f})"
    )


def report(res: dict[str, Any]) -> str:
    j, o, s = res["judge"], res["offload"], res["ipc"]
    f = ", ".join
    offs = f(f"{m['offload_s']:.2f}" for m in o["moves"])
    ons = f(f"{m['onload_s']:.2f}" for m in o["moves"])
    lines = [
        f"### {res['date']} — memory handoff and weight sync on one {res['gpu']}",
        "",
        f"torch {res['torch']}, transformers {res['transformers']}; command: `{res['command']}`",
        "",
        f"**Judge sleep / wake** (random Qwen3-4B shape, bf16, hf engine, "
        f"mem_fraction_static 0.3 → batch budget {j['budget'].get('tokens')} tokens):",
        "",
        "| round | sleep s | wake s | sleep + wake s | GPU asleep GB | GPU woken GB "
        "| weights bit-identical | greedy identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (a, b) in enumerate(zip(j["sleep_s"], j["wake_s"], strict=True)):
        lines.append(
            f"| {i + 1} | {a:.2f} | {b:.2f} | {a + b:.2f} | {j['gpu_asleep_gb'][i]:.2f} "
            f"| {j['gpu_woken_gb'][i]:.2f} | {j['weights_bit_identical'][i]} "
            f"| {j['greedy_identical'][i]} |"
        )
    lines += [
        "",
        f"GPU used before the engine {j['gpu_before_engine_gb']:.2f} GB, awake after load and "
        f"one batch {j['gpu_awake_gb']:.2f} GB; pinned host buffers {j['host_buffer_gb']:.2f} GB "
        f"(allocated at the first sleep). Greedy repeatable awake, without a sleep: "
        f"{j['greedy_repeatable_awake']}. Load {j['load_s']:.1f} s. The 0.6B policy at share "
        "0.005: "
        f"`{j['small_share_error']}`",
        "",
        f"**Trainer offload / onload** (random Qwen3-0.6B shape, fp32 weights + AdamW state, "
        f"{o['host_buffer_gb']:.2f} GB of pinned host buffers): GPU {o['gpu_trainer_gb']:.2f} GB "
        f"loaded, {o['gpu_offloaded_gb']:.2f} GB offloaded; offload s {offs}, onload s {ons}; "
        f"same host buffers every offload: {o['host_buffers_reused']}.",
        "",
        f"**Weight sync, CUDA IPC to a colocated engine process** (Qwen3-0.6B shape, "
        f"{s['weights_gb_bf16']:.2f} GB in bf16, {s['buckets']} buckets of ≤ {s['bucket_mb']} MB): "
        f"sync s {f(f'{t:.3f}' for t in s['sync_s'])}; engine weights bit-identical to the "
        f"trainer's cast to bf16: {s['weights_equal_trainer_bf16']}; engine's next greedy output "
        f"equals the trainer model's (its bf16 weights in a fresh engine): "
        f"{s['greedy_equals_trainer']} (changed by the sync: "
        f"{s['greedy_changed_by_sync']}); weight version {s['weight_version']}. Teacher-forced "
        f"under the trainer's model (bf16): after the sync "
        f"{agree(s['greedy_vs_trainer_model'])}; the engine's output from before the sync "
        f"{agree(s['greedy_before_sync_vs_trainer_model'])}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (a check of the script)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--parts", default="judge,offload,ipc", help="which of the three to run")
    ap.add_argument(
        "--sleep-buffers",
        default="first_sleep",
        choices=["first_sleep", "start"],
        help="the judge engine's engine_config.sleep_buffers (start: as rl-core's colocated ones)",
    )
    args = ap.parse_args()
    import sys

    import transformers

    from genrm_serve.testing import build_random_qwen3

    work = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-handoff-"))
    judge_shape = QUICK if args.quick else JUDGE_4B
    policy_shape = QUICK if args.quick else POLICY_06B
    res: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": "python benchmarks/gpu_handoff.py " + " ".join(sys.argv[1:]),
    }
    t0 = time.perf_counter()
    judge = build_random_qwen3(work / "judge", **judge_shape, seed=0)
    policy = build_random_qwen3(work / "policy", **policy_shape, seed=1)
    print(f"models built in {time.perf_counter() - t0:.1f}s", flush=True)
    parts = args.parts.split(",")
    if "judge" in parts:
        res["judge"] = asyncio.run(judge_sleep_wake(judge, args.rounds, policy, args.sleep_buffers))
        print(json.dumps(res["judge"]), flush=True)
    backend = trainer_backend(policy) if {"offload", "ipc"} & set(parts) else None
    if "offload" in parts:
        res["offload"] = offload_onload(backend)
        print(json.dumps(res["offload"]), flush=True)
    if "ipc" in parts:
        res["ipc"] = ipc_sync(policy, backend, args.syncs, args.bucket_mb)
        print(json.dumps(res["ipc"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    if all(k in res for k in ("judge", "offload", "ipc")):
        print(report(res))


if __name__ == "__main__":
    main()
