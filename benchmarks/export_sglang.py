"""An exported model folder loads in transformers on CUDA and in SGLang, with the trainer's
log-probs (bf16 rounding apart).

Two halves, because the GPU machine has no rl-core install:

1. ``prep DIR`` (CPU, this workspace): a tiny random Qwen3 (SGLang's own architecture) with the
   tiny byte-level tokenizer, one GRPO step on the torch backend so the weights are the
   trainer's and not the base's, saved as a checkpoint, ``rl-core export``-ed to bf16 in
   ``DIR/model``, and the trainer's fp32 log-probs of a held-out sequence in
   ``DIR/trainer.json``.
2. ``check DIR`` (GPU, SGLang importable): the folder in ``AutoModelForCausalLM`` on CUDA and in
   ``sglang.Engine``; the dtype each loaded, and the largest log-prob difference of each against
   the trainer and against each other. Prints JSON (``--json PATH`` writes it too).

    python benchmarks/export_sglang.py prep /tmp/export-check        # here
    python benchmarks/export_sglang.py check /tmp/export-check       # on the GPU machine

On the GPU machine's SGLang archive, SGLang needs ``attention_backend="triton"`` and
``sampling_backend="pytorch"`` (no FlashAttention-3 in it; see benchmarks/sglang_env.sh).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: the held-out sequence whose log-probs are compared (token ids of the tiny tokenizer)
IDS = [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54]


def prep(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from genrm_serve.testing import build_tiny_tokenizer
    from rl_core.backends.base import BackendConfig, TrainItem
    from rl_core.backends.torch_hf import TorchHFBackend
    from rl_core.export import export_hf

    tok = build_tiny_tokenizer(512)
    base = out / "base"
    shutil.rmtree(out, ignore_errors=True)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        initializer_range=0.15,  # peaked logits: log-probs far from uniform
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(base)
    tok.save_pretrained(base)
    backend = TorchHFBackend(base, BackendConfig(lr=1e-2, temperature=1.0))
    item = TrainItem(IDS, response_start=4, advantage=1.0, in_loss=True)
    backend.train_step([item], old_logprobs=None)
    ckpt = out / "ckpt"
    backend.save(ckpt, {"rollout_step": 1, "base_model": str(base.resolve())})
    logprobs = backend.logprobs([TrainItem(IDS, response_start=1, advantage=0.0, in_loss=True)])
    export_hf(ckpt, out / "model", dtype="bf16")
    (out / "trainer.json").write_text(json.dumps({"ids": IDS, "logprobs": logprobs[0].tolist()}))
    shutil.rmtree(ckpt)
    shutil.rmtree(base)
    print(f"exported to {out / 'model'}: {sorted(p.name for p in (out / 'model').iterdir())}")


def _max_abs(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def check(folder: Path) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    model_dir = str(folder / "model")
    trainer = json.loads((folder / "trainer.json").read_text())
    ids, want = trainer["ids"], trainer["logprobs"]
    result: dict[str, Any] = {"transformers": transformers.__version__}
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir).cuda().eval()
        result["transformers_dtype"] = str(model.dtype)
        with torch.no_grad():
            logits = model(torch.tensor([ids]).cuda()).logits[0].float()
        lp = torch.log_softmax(logits, -1)
        hf = [float(lp[p, ids[p + 1]]) for p in range(len(ids) - 1)]
        result["transformers_vs_trainer_max_abs"] = _max_abs(hf, want)
        del model
        torch.cuda.empty_cache()

        import sglang

        result["sglang"] = sglang.__version__
        t0 = time.perf_counter()
        engine = sglang.Engine(
            model_path=model_dir,
            attention_backend="triton",
            sampling_backend="pytorch",
            mem_fraction_static=0.3,
            disable_cuda_graph=True,
            log_level="warning",
            random_seed=0,
        )
        result["sglang_start_s"] = round(time.perf_counter() - t0, 1)
        result["sglang_dtype"] = str(engine.tokenizer_manager.model_config.dtype)
        out = engine.generate(
            input_ids=ids,
            sampling_params={"max_new_tokens": 1, "temperature": 0},
            return_logprob=True,
            logprob_start_len=0,
        )
        sg = [x[0] for x in out["meta_info"]["input_token_logprobs"]][1:]
        result["sglang_vs_trainer_max_abs"] = _max_abs(sg, want)
        result["sglang_vs_transformers_max_abs"] = _max_abs(sg, hf)
        result["trainer_logprob_mean"] = sum(want) / len(want)
        engine.shutdown()
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("prep", help="export a trained tiny model (CPU)").add_argument("dir", type=Path)
    chk = sub.add_parser("check", help="load it in transformers and SGLang (GPU)")
    chk.add_argument("dir", type=Path)
    chk.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.what == "prep":
        prep(args.dir)
        return 0
    result = check(args.dir)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if "error" in result else 0


if __name__ == "__main__":  # SGLang's engine spawns processes that re-import this module
    sys.exit(main())
