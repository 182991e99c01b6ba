"""``rl-core export``: a checkpoint of either backend as a Hugging Face folder.

What a user relies on: the exported model computes the trainer's log-probs (exactly in fp32,
within bf16 rounding in bf16), the folder loads wherever a model folder is taken (transformers,
``rl-core train --hf-checkpoint``, genrm-serve's engine), holds no optimizer state, and a bad
input is refused in one line before any weight is read. Tiny random models, CPU only.
"""

import asyncio
import json
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from genrm_serve.testing import build_tiny_model
from rl_core import export as export_mod
from rl_core.backends.base import BackendConfig, TrainItem
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.cli import main as cli_main
from rl_core.export import ExportError, base_model_record, export_hf

ITEMS = [
    TrainItem(tokens=[1, 5, 6, 7, 8, 9], response_start=3, advantage=1.0, in_loss=True),
    TrainItem(tokens=[1, 4, 12, 13, 14, 15, 16], response_start=2, advantage=-1.0, in_loss=True),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny Llama with its tokenizer and generation config (what a real base model has)."""
    return build_tiny_model(tmp_path_factory.mktemp("base"), vocab=128, hidden=32)


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory):
    """A ``--save`` folder of one trained step of the torch backend, and the trainer's
    log-probs and weights after it."""
    root = tmp_path_factory.mktemp("save")
    backend = TorchHFBackend(base, BackendConfig(lr=1e-2))
    backend.train_step(ITEMS, old_logprobs=None)
    extra = {"rollout_step": 1, "base_model": base_model_record(str(base)), "cursor": {}}
    backend.save(root / "step_000001", extra)
    (root / "latest").write_text("step_000001")
    return root, backend.logprobs(ITEMS), backend.export_weights()


def _logprobs(folder):
    return TorchHFBackend(folder, BackendConfig()).logprobs(ITEMS)


def test_fp32_export_is_the_trainer_exactly_and_carries_no_optimizer(trained, tmp_path):
    root, want, weights = trained
    out = export_hf(root, tmp_path / "hf", dtype="fp32")
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "float32" and config["use_cache"] is True
    for got, w in zip(_logprobs(out), want, strict=True):
        torch.testing.assert_close(got, w, atol=1e-6, rtol=0)
    tensors = load_file(out / "model.safetensors")
    assert {k: v.dtype for k, v in tensors.items()} == {k: torch.float32 for k in weights}
    for k, v in weights.items():
        assert torch.equal(tensors[k], v), k


def test_bf16_export_is_the_trainer_rounded_to_bf16(trained, base, tmp_path):
    """The default dtype: every weight is the trainer's rounded to bf16 (2 bytes a parameter),
    so the log-probs are those of the rounded weights exactly and near the trainer's."""
    root, want, weights = trained
    out = export_hf(root / "step_000001", tmp_path / "hf")  # a step folder works as its root
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    tensors = load_file(out / "model.safetensors")
    for k, v in weights.items():
        assert tensors[k].dtype == torch.bfloat16 and torch.equal(tensors[k], v.bfloat16()), k
    rounded = TorchHFBackend(base, BackendConfig())
    with torch.no_grad():
        for k, p in rounded.model.named_parameters():
            p.copy_(weights[k].bfloat16().float())
    got = _logprobs(out)
    for g, r, w in zip(got, rounded.logprobs(ITEMS), want, strict=True):
        torch.testing.assert_close(g, r, atol=1e-6, rtol=0)
        assert float((g - w).abs().max()) < 0.1  # bf16 rounding of the weights, no more
    assert (out / "model.safetensors").stat().st_size < 0.6 * sum(
        f.stat().st_size for f in (root / "step_000001" / "model").glob("*.safetensors")
    )


def test_the_folder_loads_as_a_policy_and_in_genrm_serve(trained, tmp_path):
    """``rl-core train --hf-checkpoint OUT`` (its preflight check and model resolution) and the
    judge service's transformers engine both take the exported folder."""
    from genrm_serve import check_model_path
    from genrm_serve.config import EngineConfig, InstanceSpec
    from genrm_serve.engines.hf import HFEngine
    from rl_core.launch import resolve_model

    out = export_hf(trained[0], tmp_path / "hf")
    check_model_path(str(out))
    assert Path(resolve_model(str(out))) == out
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(out),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(device="cpu", dtype="float32"),  # type: ignore[arg-type]
    )
    engine = HFEngine(spec, "judge/0")
    asyncio.run(engine.start())
    try:
        vocab = json.loads((out / "config.json").read_text())["vocab_size"]
        assert engine.state == "awake" and engine.model.config.vocab_size == vocab
        assert engine.tokenizer("hello").input_ids
    finally:
        asyncio.run(engine.shutdown())


def test_the_command_writes_the_folder(trained, tmp_path, capsys):
    out = tmp_path / "hf"
    assert cli_main(["export", str(trained[0]), str(out), "--dtype", "fp16"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    assert cli_main(["export", str(trained[0]), str(out), "--force"]) == 0  # replaced
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def _refusal_cases(tmp: Path, root: Path, base: Path) -> dict[str, tuple[list[str], str]]:
    (tmp / "plain").mkdir()
    (tmp / "full").mkdir()
    (tmp / "full" / "x").write_text("x")
    old = tmp / "old"  # a checkpoint written before checkpoints recorded their base model
    (old / "model").mkdir(parents=True)
    for f in (root / "step_000001" / "model").iterdir():
        (old / "model" / f.name).symlink_to(f)
    (old / "state.json").write_text(json.dumps({"step": 1, "extra": {"rollout_step": 1}}))
    other = build_tiny_model(tmp / "other", vocab=128, hidden=48)
    untokenized = tmp / "untokenized"
    untokenized.mkdir()
    (untokenized / "config.json").write_text((base / "config.json").read_text())
    ckpt, out = str(root), str(tmp / "out")
    return {
        "missing checkpoint": (
            [str(tmp / "nope"), out],
            r"CHECKPOINT .*nope: no such folder",
        ),
        "a folder that is no checkpoint": (
            [str(tmp / "plain"), out],
            r"CHECKPOINT .*plain: not a checkpoint \(no state.json and model/config.json",
        ),
        "unknown dtype": ([ckpt, out, "--dtype", "int4"], r"--dtype int4: unknown; one of bf16"),
        "out not empty": ([ckpt, str(tmp / "full")], r"OUT .*full: exists and is not empty"),
        "out is a file": ([ckpt, str(tmp / "full" / "x")], r"OUT .*x: exists and is not a folder"),
        "out inside the checkpoint": (
            [ckpt, str(root / "step_000001" / "hf")],
            r"OUT .*hf: overlaps the checkpoint",
        ),
        "no base model recorded": (
            [str(old), out],
            r"records no base_model .*pass --base-model PATH",
        ),
        "base model missing": (
            [str(old), out, "--base-model", str(tmp / "nobase")],
            r"--base-model .*nobase: no such folder",
        ),
        "base model of another architecture": (
            [ckpt, out, "--base-model", str(other)],
            r"--base-model .*other: its hidden_size is 48, the checkpoint's is 32",
        ),
        "base model without a tokenizer": (
            [ckpt, out, "--base-model", str(untokenized)],
            r"--base-model .*untokenized: no tokenizer files there",
        ),
    }


_CASES = [
    "missing checkpoint",
    "a folder that is no checkpoint",
    "unknown dtype",
    "out not empty",
    "out is a file",
    "out inside the checkpoint",
    "no base model recorded",
    "base model missing",
    "base model of another architecture",
    "base model without a tokenizer",
]


@pytest.mark.parametrize("name", _CASES)
def test_bad_input_is_refused_in_one_line_before_any_weight_is_read(
    name, trained, base, tmp_path, capsys, monkeypatch
):
    import re

    cases = _refusal_cases(tmp_path, trained[0], base)
    assert sorted(cases) == sorted(_CASES)
    argv, message = cases[name]

    def no_weights(*_a, **_k):
        raise AssertionError("weights read before the inputs were checked")

    monkeypatch.setattr(export_mod, "_checkpoint_tensors", no_weights)
    capsys.readouterr()  # the progress bars of building the cases' models
    assert cli_main(["export", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rl-core export: "), err
    assert re.search(message, err), err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_an_interrupted_export_leaves_no_folder(trained, tmp_path, monkeypatch):
    def fail(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(export_mod, "_write_shards", fail)
    with pytest.raises(KeyboardInterrupt):
        export_hf(trained[0], tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []  # neither OUT nor its hidden staging folder


def test_a_large_model_is_sharded_with_an_index(trained, tmp_path, monkeypatch):
    monkeypatch.setattr(export_mod, "SHARD_BYTES", 20_000)
    out = export_hf(trained[0], tmp_path / "hf", dtype="fp32")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((out / f).is_file() for f in files)
    for got, w in zip(_logprobs(out), trained[1], strict=True):
        torch.testing.assert_close(got, w, atol=1e-6, rtol=0)


def test_exporting_an_unknown_dtype_from_python_names_it(trained, tmp_path):
    with pytest.raises(ExportError, match=r"--dtype bf8: unknown"):
        export_hf(trained[0], tmp_path / "hf", dtype="bf8")


# --- Megatron, tensor parallel 2 ------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # two spawned Megatron ranks: ~110 s on 2 busy cores
def test_a_tensor_parallel_megatron_checkpoint_exports_the_trainers_weights(
    tmp_path, char_tokenizer
):
    """TP = 2 ranks train a step and save (the shards gathered into one HF folder); the export
    holds the trainer's weights exactly and computes the Megatron policy's log-probs."""
    pytest.importorskip(
        "megatron.core", reason="megatron-core (the [megatron] extra) not installed"
    )
    import torch.multiprocessing as mp
    from megatron_tiny import qwen3_config, save_hf_model, train_items, two_rank_worker

    from rl_core.backends.megatron.backend import MegatronBackend

    base = save_hf_model(qwen3_config(tied=False), tmp_path / "qwen3")
    char_tokenizer.save_pretrained(base)
    out = tmp_path / "rank0.pt"
    mp.spawn(
        two_rank_worker,
        args=(2, _free_port(), str(base), "tp", str(out)),
        nprocs=2,
        join=True,
    )
    weights = torch.load(out, weights_only=False)["weights"]  # gathered after the step
    hf = export_hf(tmp_path / "tp-ckpt", tmp_path / "hf", dtype="fp32", base_model=str(base))
    assert (hf / "tokenizer.json").is_file()
    tensors = load_file(hf / "model.safetensors")
    assert set(tensors) == set(weights)
    for k, v in weights.items():
        assert torch.equal(tensors[k], v), k
    cfg = BackendConfig(max_tokens_per_micro_batch=12, temperature=0.8)
    policy = MegatronBackend(hf, cfg, device="cpu")
    try:
        want = policy.logprobs(train_items())
    finally:
        policy.close()
    got = TorchHFBackend(hf, cfg).logprobs(train_items())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=2e-6, rtol=0)
