"""Weight decay: applied to weight matrices and embeddings, never to norms and biases."""

import torch

from rl_core.backends.base import BackendConfig, TrainItem, param_groups
from rl_core.backends.torch_hf import TorchHFBackend


def test_groups_split_norms_and_biases_from_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3), torch.nn.Linear(3, 2))
    model[2].bias.requires_grad_(False)
    decay, no_decay = param_groups(model.named_parameters(), 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [(3, 4), (2, 3)]
    # the frozen bias is in no group at all
    assert [tuple(p.shape) for p in no_decay["params"]] == [(3,), (3,), (3,)]
    # an empty group is left out (torch's optimizers refuse a group without parameters)
    only_norm = param_groups(torch.nn.LayerNorm(3).named_parameters(), 0.1)
    assert [g["weight_decay"] for g in only_norm] == [0.0]


def test_torch_backend_decays_matrices_only(tiny_model_path):
    """Zero advantages give zero gradients, so AdamW's step is decay alone: matrices shrink
    by lr × weight_decay, norm gains stay put."""
    cfg = BackendConfig(lr=0.1, weight_decay=0.5)
    backend = TorchHFBackend(tiny_model_path, cfg)
    before = {k: v.detach().clone() for k, v in backend.model.named_parameters()}
    items = [TrainItem([1, 5, 6, 7, 8], 2, 0.0, True)]
    backend.train_step(items, old_logprobs=None)
    for k, v in backend.model.named_parameters():
        want = before[k] if v.ndim < 2 else before[k] * (1 - 0.1 * 0.5)
        torch.testing.assert_close(v.detach(), want, atol=1e-7, rtol=0, msg=k)
