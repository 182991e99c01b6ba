"""The PyTorch + transformers backend on a tiny random model: log-probs, steps, checkpoints."""

import pytest
import torch

from rl_core.backends.base import BackendConfig, TrainItem, lr_at
from rl_core.backends.torch_hf import TorchHFBackend, micro_batches, token_logprobs
from rl_core.grpo.loss import LossConfig


def _items():
    return [
        TrainItem(tokens=[1, 5, 6, 7, 8, 9], response_start=3, advantage=1.0, in_loss=True),
        TrainItem(tokens=[1, 5, 6, 10, 11], response_start=3, advantage=-1.0, in_loss=True),
        TrainItem(tokens=[1, 4, 12, 13, 14, 15, 16], response_start=2, advantage=0.5, in_loss=True),
    ]


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["plain", "softcap"])
def test_chunked_logprobs_match_full_softmax(softcap):
    torch.manual_seed(0)
    hidden, weight = torch.randn(7, 8), torch.randn(50, 8)
    targets = torch.randint(0, 50, (7,))
    logp, ent = token_logprobs(
        hidden, weight, targets, temperature=0.7, softcap=softcap, chunk_size=3
    )
    logits = hidden @ weight.t()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    full = torch.log_softmax(logits / 0.7, -1)
    assert torch.allclose(logp, full.gather(-1, targets[:, None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(ent, -(full.exp() * full).sum(-1), atol=1e-5)


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        pytest.param([4, 4, 4], 8, [[0, 1], [2]], id="pairs"),
        pytest.param([2, 6, 2], 12, [[0, 1], [2]], id="padded-size-counts"),
        pytest.param([20, 3], 8, [[0], [1]], id="oversized-item-alone"),
    ],
)
def test_micro_batches(lengths, budget, expected):
    items = [TrainItem([1] * n, 1, 0.0, True) for n in lengths]
    assert micro_batches(items, budget) == expected


@pytest.mark.parametrize(
    ("cfg", "step", "lr"),
    [
        pytest.param(BackendConfig(lr=1.0), 5, 1.0, id="constant"),
        pytest.param(BackendConfig(lr=1.0, lr_warmup_iters=4), 1, 0.5, id="warmup"),
        pytest.param(
            BackendConfig(lr=1.0, lr_decay_style="linear", lr_decay_iters=10, min_lr=0.0),
            5,
            0.5,
            id="linear",
        ),
        pytest.param(
            BackendConfig(lr=1.0, lr_decay_style="cosine", lr_decay_iters=10),
            10,
            0.0,
            id="cosine-end",
        ),
    ],
)
def test_lr_schedule(cfg, step, lr):
    assert lr_at(cfg, step) == pytest.approx(lr)


def test_logprobs_match_plain_forward(tiny_model_path):
    backend = TorchHFBackend(tiny_model_path, BackendConfig(temperature=1.0))
    items = _items()
    lps = backend.logprobs(items)
    for it, lp in zip(items, lps, strict=True):
        with torch.no_grad():
            logits = backend.model(torch.tensor([it.tokens])).logits[0].float()
        full = torch.log_softmax(logits, -1)
        want = [full[p, it.tokens[p + 1]] for p in range(it.response_start - 1, len(it.tokens) - 1)]
        assert torch.allclose(lp, torch.stack(want), atol=1e-4)


def _train(path, cfg, items, steps=1):
    backend = TorchHFBackend(path, cfg)
    for _ in range(steps):
        metrics = backend.train_step(items, old_logprobs=backend.logprobs(items))
    return backend, metrics


def test_step_moves_logprobs_along_advantage(tiny_model_path):
    cfg = BackendConfig(lr=1e-3, clip_grad=10.0)
    items = _items()
    backend, metrics = _train(tiny_model_path, cfg, items)
    before = TorchHFBackend(tiny_model_path, cfg).logprobs(items)
    after = backend.logprobs(items)

    # The objective sum_i A_i * log p(response_i) went up: probability moved along the advantage.
    def objective(lps):
        return sum(it.advantage * lp.sum() for it, lp in zip(items, lps, strict=True))

    assert objective(after) > objective(before)
    assert metrics["grad_norm"] > 0 and metrics["train_tokens"] == 3 + 2 + 5
    assert backend.step == 1


def test_masked_samples_do_not_train(tiny_model_path):
    items = [TrainItem(it.tokens, it.response_start, it.advantage, False) for it in _items()]
    backend, metrics = _train(tiny_model_path, BackendConfig(lr=1e-2), items)
    fresh = TorchHFBackend(tiny_model_path, BackendConfig())
    for k, v in backend.model.state_dict().items():
        assert torch.equal(v, fresh.model.state_dict()[k]), k
    assert metrics["micro_batches"] == 0


def test_micro_batching_does_not_change_the_update(tiny_model_path):
    """Token-level aggregation over the global batch: the split into micro-batches is invisible."""
    items = _items()
    # adam_eps=1 makes the first Adam step ≈ lr * grad (not sign(grad)), so grads are compared.
    big, mb = _train(tiny_model_path, BackendConfig(adam_eps=1.0, lr=1.0, clip_grad=1e9), items)
    small, ms = _train(
        tiny_model_path,
        BackendConfig(adam_eps=1.0, lr=1.0, clip_grad=1e9, max_tokens_per_micro_batch=7),
        items,
    )
    assert (mb["micro_batches"], ms["micro_batches"]) == (1, 3)
    assert ms["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-4)
    for k, v in big.model.state_dict().items():
        assert torch.allclose(v, small.model.state_dict()[k], atol=1e-5), k


def test_reference_loaded_only_with_nonzero_kl(tiny_model_path):
    off = TorchHFBackend(tiny_model_path, BackendConfig(loss=LossConfig(use_kl_loss=True)))
    assert off.ref_model is None
    on = TorchHFBackend(
        tiny_model_path, BackendConfig(loss=LossConfig(use_kl_loss=True, kl_loss_coef=0.1))
    )
    assert on.ref_model is not None
    assert torch.allclose(
        torch.cat(on.logprobs(_items(), reference=True)), torch.cat(on.logprobs(_items()))
    )


def test_resume_gives_the_same_next_step(tiny_model_path, tmp_path):
    cfg = BackendConfig(lr=1e-2, weight_decay=0.1)
    items = _items()
    straight, _ = _train(tiny_model_path, cfg, items, steps=2)

    first, _ = _train(tiny_model_path, cfg, items, steps=1)
    first.save(tmp_path / "ckpt", {"cursor": {"epoch": 0, "offset": 3}})
    resumed = TorchHFBackend(tiny_model_path, cfg)
    extra = resumed.load(tmp_path / "ckpt")
    assert extra == {"cursor": {"epoch": 0, "offset": 3}} and resumed.step == 1
    resumed.train_step(items, old_logprobs=resumed.logprobs(items))
    for k, v in straight.model.state_dict().items():
        assert torch.allclose(v, resumed.model.state_dict()[k], atol=1e-6), k


def test_a_load_while_offloaded_is_refused_and_one_after_onload_resumes(tiny_model_path, tmp_path):
    first, _ = _train(tiny_model_path, BackendConfig(lr=1e-2), _items(), steps=1)
    first.save(tmp_path / "ckpt", {"cursor": 1})
    resumed = TorchHFBackend(tiny_model_path, BackendConfig(lr=1e-2))
    resumed.offload()
    with pytest.raises(RuntimeError, match="onload"):
        resumed.load(tmp_path / "ckpt")
    assert resumed.step == 0
    resumed.onload()
    assert resumed.load(tmp_path / "ckpt") == {"cursor": 1} and resumed.step == 1


def test_offload_blocks_use_until_onload(tiny_model_path):
    backend = TorchHFBackend(tiny_model_path, BackendConfig())
    backend.offload()
    with pytest.raises(RuntimeError, match="onload"):
        backend.logprobs(_items())
    backend.onload()
    assert len(backend.logprobs(_items())) == 3


def test_on_policy_step_without_old_logprobs_is_the_same_update(tiny_model_path):
    """old_logprobs=None (one step per rollout) equals passing the current policy's log-probs."""
    items = _items()
    cfg = BackendConfig(lr=1e-2, loss=LossConfig(use_tis=False))
    a, _ = _train(tiny_model_path, cfg, items)
    b = TorchHFBackend(tiny_model_path, cfg)
    b.train_step(items, old_logprobs=None)
    for k, v in a.model.state_dict().items():
        assert torch.allclose(v, b.model.state_dict()[k], atol=1e-6), k
