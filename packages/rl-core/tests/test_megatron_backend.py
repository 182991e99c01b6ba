"""The Megatron-core backend on CPU (gloo, fp32) against the torch backend, same HF weights.

Megatron's GPTModel runs on CPU once ``torch.cuda.current_device`` is answered with "cpu"
(the backend does that itself on CPU) and with our SDPA core attention (no CUDA RNG fork).
Each backend starts a world-of-one gloo group and ``close()`` ends it, so nothing leaks into
other tests; the TP = 2 / DP = 2 cases run in spawned processes.
"""

import importlib.util
import socket

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core (the [megatron] extra) not installed")

from megatron_tiny import (
    llama3_rope_config,
    llama_config,
    qwen2_config,
    qwen3_config,
    save_hf_model,
    train_items,
    two_rank_worker,
)

from rl_core.backends.base import BackendConfig, TrainItem
from rl_core.backends.megatron.backend import MegatronBackend, pack_micro_batches
from rl_core.backends.torch_hf import TorchHFBackend
from rl_core.grpo.loss import LossConfig, grpo_loss


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory):
    return save_hf_model(qwen3_config(tied=False), tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def qwen3_tied_path(tmp_path_factory):
    return save_hf_model(qwen3_config(tied=True), tmp_path_factory.mktemp("qwen3-tied"), seed=1)


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return save_hf_model(llama_config(), tmp_path_factory.mktemp("llama"), seed=2)


@pytest.fixture(scope="module")
def llama3_rope_path(tmp_path_factory):
    return save_hf_model(llama3_rope_config(), tmp_path_factory.mktemp("llama3-rope"), seed=3)


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory):
    return save_hf_model(qwen2_config(), tmp_path_factory.mktemp("qwen2"), seed=4)


class _Megatron:
    """Build a backend and always close its process group (even when the test fails)."""

    def __init__(self):
        self.made = []

    def __call__(self, path, cfg, parallel=None):
        b = MegatronBackend(path, cfg, parallel, device="cpu")
        self.made.append(b)
        return b


@pytest.fixture
def megatron():
    m = _Megatron()
    yield m
    for b in m.made:
        b.close()


def test_pack_micro_batches_counts_tokens_not_padding():
    items = [TrainItem([1] * n, 1, 0.0, True) for n in (2, 6, 2, 20, 3)]
    assert pack_micro_batches(items, 10) == [[0, 1, 2], [3], [4]]


@pytest.mark.parametrize("which", ["qwen3", "qwen3_tied", "llama", "llama3_rope", "qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_the_torch_backend(which, temperature, megatron, request):
    path = request.getfixturevalue(f"{which}_path")
    # a micro-batch budget that packs 2-3 sequences per row and leaves one alone
    cfg = BackendConfig(
        temperature=temperature, max_tokens_per_micro_batch=12, logprob_chunk_size=5
    )
    want = TorchHFBackend(path, cfg).logprobs(train_items())
    got = megatron(path, cfg).logprobs(train_items())
    for w, g, it in zip(want, got, train_items(), strict=True):
        assert g.shape == (it.response_len,)
        torch.testing.assert_close(g, w, atol=2e-6, rtol=0)


def test_a_pack_of_equal_lengths_attends_within_each_sequence(qwen3_path, megatron):
    """Three 4-token sequences in one pack take the batched attention path (one call for the
    pack): each still sees only itself, as the torch backend's padded batch does."""
    items = [
        TrainItem(tokens=[1, 5 + i, 6, 7 + i], response_start=2, advantage=1.0, in_loss=True)
        for i in range(3)
    ]
    cfg = BackendConfig(max_tokens_per_micro_batch=12)
    want = TorchHFBackend(qwen3_path, cfg).logprobs(items)
    got = megatron(qwen3_path, cfg).logprobs(items)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, atol=2e-6, rtol=0)


def test_bf16_autocast_logprobs_equal_the_torch_backend(qwen3_path, megatron):
    """Under bf16 autocast (fp32 masters) both backends round at the same places — an fp32
    residual stream, queries and keys normalised into fp32 before RoPE — so on one device, with
    the same kernels, their log-probs are equal, not merely close (2-3e-3 mean apart before).

    Training under bf16 needs CUDA (Megatron's linear layers re-enter autocast in their
    backward only there); on CPU the backend says so instead of failing inside the backward.
    """
    cfg = BackendConfig(bf16=True, max_tokens_per_micro_batch=12)
    torch_backend = TorchHFBackend(qwen3_path, cfg)
    torch_backend.bf16 = True  # even where this CPU would refuse bf16 as slow: numerics only
    want = torch.cat(torch_backend.logprobs(train_items()))
    fp32 = torch.cat(TorchHFBackend(qwen3_path, BackendConfig(bf16=False)).logprobs(train_items()))
    assert (want - fp32).abs().max() > 1e-4  # bf16 really was on
    b = megatron(qwen3_path, cfg)
    got = torch.cat(b.logprobs(train_items()))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"bf16 .* needs CUDA"):
        b.train_step(train_items(), old_logprobs=None)


def _loss(logps, old, items):
    lp, ol = torch.cat(logps), torch.cat(old)
    adv = torch.cat([torch.full((it.response_len,), it.advantage) for it in items])
    return float(
        grpo_loss(lp, ol, adv, torch.ones_like(lp), LossConfig(), total_tokens=len(lp)).loss
    )


def test_one_grpo_step_lowers_the_loss_in_both_and_updates_alike(qwen3_path, megatron):
    # adam_eps=1 makes the first Adam step ≈ lr·g/(|g|+1), so the two updates compare gradients
    cfg = BackendConfig(
        lr=0.05, adam_eps=1.0, clip_grad=1e9, weight_decay=0.1, max_tokens_per_micro_batch=12
    )
    items = train_items()
    torch_b, mega_b = TorchHFBackend(qwen3_path, cfg), megatron(qwen3_path, cfg)
    results = {}
    for name, b in (("torch", torch_b), ("megatron", mega_b)):
        old = b.logprobs(items)
        metrics = b.train_step(items, old_logprobs=old)
        new = b.logprobs(items)
        results[name] = (metrics, new)
        assert _loss(new, old, items) < _loss(old, old, items), name
    (mt, new_t), (mm, new_m) = results["torch"], results["megatron"]
    assert mm["grad_norm"] == pytest.approx(mt["grad_norm"], rel=1e-4)
    assert mm["loss"] == pytest.approx(mt["loss"], abs=1e-6)
    assert mm["train_tokens"] == mt["train_tokens"] == 3 + 2 + 7 + 3
    torch.testing.assert_close(torch.cat(new_m), torch.cat(new_t), atol=1e-4, rtol=0)
    # and the exported weights (HF names) are the torch backend's after its step
    exported, own = mega_b.export_weights(), dict(torch_b.model.named_parameters())
    assert set(exported) == set(own)
    for k, v in exported.items():
        torch.testing.assert_close(v, own[k].detach(), atol=1e-5, rtol=0, msg=k)


def test_norms_and_biases_are_not_decayed(qwen3_path, megatron):
    """Zero advantages give zero gradients: the AdamW step is decay alone, on matrices only."""
    b = megatron(qwen3_path, BackendConfig(lr=0.1, weight_decay=0.5))
    before = b.export_weights()
    b.train_step([TrainItem([1, 5, 6, 7, 8], 2, 0.0, True)], old_logprobs=None)
    for k, v in b.export_weights().items():
        want = before[k] if v.ndim < 2 else before[k] * (1 - 0.1 * 0.5)
        torch.testing.assert_close(v, want, atol=1e-7, rtol=0, msg=k)


def test_reference_is_loaded_only_with_a_nonzero_kl_coef(qwen3_path, megatron):
    off = megatron(qwen3_path, BackendConfig(loss=LossConfig(use_kl_loss=True)))
    assert off.ref_model is None
    off.close()
    cfg = BackendConfig(lr=1e-2, loss=LossConfig(use_kl_loss=True, kl_loss_coef=0.1))
    on = megatron(qwen3_path, cfg)
    ref = on.logprobs(train_items(), reference=True)
    torch.testing.assert_close(torch.cat(ref), torch.cat(on.logprobs(train_items())))
    metrics = on.train_step(train_items(), old_logprobs=None, ref_logprobs=ref)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7)  # policy = reference before the step
    # the step moved the policy, not the frozen reference
    torch.testing.assert_close(
        torch.cat(on.logprobs(train_items(), reference=True)), torch.cat(ref)
    )
    assert not torch.allclose(torch.cat(on.logprobs(train_items())), torch.cat(ref))


def test_masked_samples_do_not_train(qwen3_path, megatron):
    items = [TrainItem(it.tokens, it.response_start, it.advantage, False) for it in train_items()]
    b = megatron(qwen3_path, BackendConfig(lr=1e-2))
    before = b.export_weights()
    metrics = b.train_step(items, old_logprobs=None)
    assert metrics["micro_batches"] == 0 and b.step == 1
    for k, v in b.export_weights().items():
        assert torch.equal(v, before[k]), k


def test_total_tokens_normalise_the_loss(qwen3_path, megatron):
    """A data-parallel rank divides by the global batch's tokens, not its own."""
    b = megatron(qwen3_path, BackendConfig())
    local = b.train_step(train_items(), old_logprobs=None)
    half = b.train_step(train_items(), old_logprobs=None, total_tokens=2 * local["train_tokens"])
    assert half["train_tokens"] == local["train_tokens"] == 15  # this rank's tokens
    assert half["pg_loss"] == pytest.approx(local["pg_loss"] / 2, rel=1e-3)


def test_checkpoint_loads_in_transformers_and_resumes(qwen3_path, megatron, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = BackendConfig(lr=1e-2)
    items = train_items()
    straight = megatron(qwen3_path, cfg)
    for _ in range(2):
        straight.train_step(items, old_logprobs=None)
    final = straight.export_weights()
    straight.close()

    first = megatron(qwen3_path, cfg)
    first.train_step(items, old_logprobs=None)
    first.save(tmp_path / "ckpt", {"cursor": 3})
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "model", dtype=torch.float32)
    for k, v in first.export_weights().items():
        assert torch.equal(dict(hf.named_parameters())[k].detach(), v), k
    first.close()

    resumed = megatron(qwen3_path, cfg)
    assert resumed.load(tmp_path / "ckpt") == {"cursor": 3} and resumed.step == 1
    resumed.train_step(items, old_logprobs=None)
    for k, v in resumed.export_weights().items():
        torch.testing.assert_close(v, final[k], atol=1e-6, rtol=0, msg=k)


def test_load_weights_follows_another_policy(qwen3_path, megatron):
    """A forward-only rank takes the trained policy's exported (HF-named) weights."""
    trained = megatron(qwen3_path, BackendConfig(lr=1e-2))
    trained.train_step(train_items(), old_logprobs=None)
    follower = megatron(qwen3_path, BackendConfig())
    assert not torch.equal(
        torch.cat(follower.logprobs(train_items())), torch.cat(trained.logprobs(train_items()))
    )
    follower.load_weights(trained.export_weights())
    assert torch.equal(
        torch.cat(follower.logprobs(train_items())), torch.cat(trained.logprobs(train_items()))
    )


def test_named_weights_are_the_exported_weights_in_place(qwen3_path, megatron):
    """A weight sync packs ``named_weights`` on the device: the same HF names and values as the
    exported weights, and they follow training (not a copy taken at start)."""
    backend = megatron(qwen3_path, BackendConfig(lr=1e-2))
    backend.train_step(train_items(), old_logprobs=None)
    named = dict(backend.named_weights())
    exported = backend.export_weights()
    assert list(named) == list(exported)
    for k, v in exported.items():
        assert torch.equal(named[k].cpu(), v), k
    before = {k: v.clone() for k, v in named.items()}
    backend.train_step(train_items(), old_logprobs=None)
    after = dict(backend.named_weights())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_offload_blocks_use_until_onload(qwen3_path, megatron):
    b = megatron(qwen3_path, BackendConfig())
    b.offload()
    with pytest.raises(RuntimeError, match="onload"):
        b.logprobs(train_items())
    b.onload()
    assert len(b.logprobs(train_items())) == 4


def test_offload_frees_ddp_buffers_in_place_and_training_resumes_exactly(qwen3_path, megatron):
    """What an offload moves, and how: DDP's parameter buffer is freed in place (parameters and
    optimizer shards stay its views), the Adam state is re-bound to host buffers; after onload
    the next step equals that of a backend that never moved. On CPU the backend moves nothing,
    so the offloader runs with the CPU standing in for the device, on the backend's own sets."""
    from genrm_serve import HostOffloader

    cfg = BackendConfig(lr=1e-2)
    moved, still = megatron(qwen3_path, cfg), megatron(qwen3_path, cfg)
    for b in (moved, still):
        b.train_step(train_items(), old_logprobs=None)
    views = moved.offload_views()
    assert list(views) == ["ddp:0"]
    assert any(n.endswith(":exp_avg_sq") for n in moved.offload_tensors())
    host = HostOffloader(
        moved.offload_tensors, in_place=moved.offload_views, pin=False, include_cpu=True
    )
    weights = moved.export_weights()
    host.offload()
    assert views["ddp:0"].untyped_storage().nbytes() == 0
    for name, t in moved.offload_tensors().items():
        assert t.data_ptr() == host.buffer(name).data_ptr(), name
    host.onload()
    for k, v in moved.export_weights().items():
        assert torch.equal(v, weights[k]), k
    for b in (moved, still):
        b.train_step(train_items(), old_logprobs=None)
    want = still.export_weights()
    for k, v in moved.export_weights().items():
        assert torch.equal(v, want[k]), k


# --- two processes: tensor parallel and data parallel over gloo ---------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["tp", "dp"])
def test_two_ranks_equal_one(mode, qwen3_path, megatron, tmp_path):
    """TP = 2 (vocabulary-parallel log-softmax, sharded QKV / SwiGLU) and DP = 2 (gradients
    summed over ranks, global token mean, Adam state sharded by the distributed optimizer) give
    the single-process log-probs and update; a TP checkpoint is one HF folder that loads in
    transformers and back into TP ranks; a DP checkpoint resumes its shards exactly and is
    refused, naming the sizes, by a run of another data-parallel size."""
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    out = tmp_path / "rank0.pt"
    mp.spawn(
        two_rank_worker,
        args=(2, _free_port(), str(qwen3_path), mode, str(out)),
        nprocs=2,
        join=True,
    )
    got = torch.load(out, weights_only=False)
    cfg = BackendConfig(
        lr=0.05, adam_eps=1.0, clip_grad=1e9, max_tokens_per_micro_batch=12, temperature=0.8
    )
    one = megatron(qwen3_path, cfg)
    if mode == "tp":
        for g, w in zip(got["logprobs"], one.logprobs(train_items()), strict=True):
            torch.testing.assert_close(g, w, atol=2e-6, rtol=0)
    metrics = one.train_step(train_items(), old_logprobs=None)
    if mode == "tp":
        assert got["reloaded_equal"] and got["reloaded_extra"] == {"cursor": 7}
        assert got["reloaded_step"] == 1
        hf = AutoModelForCausalLM.from_pretrained(
            tmp_path / "tp-ckpt" / "model", dtype=torch.float32
        )
        for k, v in one.export_weights().items():
            torch.testing.assert_close(
                dict(hf.named_parameters())[k].detach(), v, atol=1e-5, rtol=0
            )
    if mode == "dp":  # Adam state split over the two ranks; its checkpoint resumes exactly
        adam, total = got["adam_numels"], got["model_numel"]
        assert sum(adam) >= total and max(adam) < 0.6 * total, (adam, total)
        assert got["reloaded_extra"] == {"cursor": 5} and got["resumed_equal"]
        with pytest.raises(ValueError, match=r"data parallel 2, this run is .* data parallel 1"):
            megatron(qwen3_path, cfg).load(tmp_path / "dp-ckpt")
    assert got["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-4)
    assert got["loss"] == pytest.approx(metrics["loss"], abs=1e-6)
    for k, v in one.export_weights().items():
        torch.testing.assert_close(got["weights"][k], v, atol=1e-5, rtol=0, msg=k)


def test_megatron_imports_quietly_and_the_run_says_it_once() -> None:
    """megatron-core's four import-time warnings (no Transformer Engine / Apex) never reach the
    terminal, before a flag error or anywhere; the run's summary says it once, in our words."""
    import subprocess
    import sys

    code = (
        "import rl_core.backends.megatron\n"
        "from megatron.core import package_info\n"
        "import megatron.core.optimizer\n"
    )
    # Python's default warning filters, as a user's terminal has them
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Transformer Engine and Apex are not installed" not in out.stderr
    assert "UserWarning" not in out.stderr
    from rl_core.config import parse_train_args
    from rl_core.launch import run_notes

    cfg = parse_train_args(["--preset", "cpu-demo", "--train-backend", "megatron"])
    if importlib.util.find_spec("transformer_engine") is None:
        assert any("without Transformer Engine" in n for n in run_notes(cfg))
