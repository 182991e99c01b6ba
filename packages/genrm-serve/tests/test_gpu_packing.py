"""The packed prefill's flash path on a CUDA GPU against its masked path.

On a GPU in half precision each tree depth is one causal variable-length flash call over its
nodes plus one call against each shallower depth (no mask, no gathers), merged by log-sum-exp;
elsewhere one masked SDPA call per depth runs (the CPU tests hold that path to plain
transformers). Both are compared with the masked path in fp32 on a three-depth tree with every
awkward shape: a template all groups share, groups of different sizes, a group of one, prompts
that share nothing, a prompt that ends inside a shared run. Skipped without CUDA (the root
conftest).
"""

from __future__ import annotations

import pytest
import torch

from genrm_serve.engines.hf.packing import _prefill_masked, _prefill_varlen, build_plan

pytestmark = [pytest.mark.gpu]

HEADS, KV_HEADS, DIM = 32, 8, 128  # Qwen3-4B's attention


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(3)

    def ids(n: int) -> list[int]:
        return torch.randint(10, 30_000, (n,), generator=g).tolist()

    template = ids(40)
    prompts = []
    for question, answers in ((37, [150, 90, 151, 3]), (64, [120, 17]), (25, [200])):
        head = template + ids(question)
        prompts += [head + ids(n) for n in answers]
    prompts += [template + ids(70)]  # shares the template only
    prompts += [ids(n) for n in (33, 210)]  # shares nothing
    prompts.append(prompts[0][:60])  # ends inside a group's question
    return prompts


def test_flash_prefill_equals_the_masked_prefill() -> None:
    plan = build_plan(_prompts(), torch.device("cuda"))
    assert len(plan.runs) >= 3 and plan.shared_tokens > 0
    total = plan.num_tokens
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(heads: int) -> torch.Tensor:
        return torch.randn(total, heads, DIM, generator=g, device="cuda")

    q, k, v = rand(HEADS), rand(KV_HEADS), rand(KV_HEADS)
    scale = DIM**-0.5
    exact = _prefill_masked(plan, q, k, v, scale, None)
    half = [x.bfloat16() for x in (q, k, v)]
    flash = _prefill_varlen(plan.runs, *half, scale).float()
    masked = _prefill_masked(plan, *half, scale, None).float()
    err_flash = (flash - exact).abs()
    err_masked = (masked - exact).abs()
    assert torch.isfinite(flash).all()
    assert err_flash.max() <= 2e-2, float(err_flash.max())
    # as close to fp32 as the masked bf16 path (same inputs, same rounding of the output)
    assert err_flash.mean() <= 1.5 * err_masked.mean() + 1e-4, (
        float(err_flash.mean()),
        float(err_masked.mean()),
    )
