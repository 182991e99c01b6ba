"""The GRPO loss pieces against values worked out by hand."""

import math

import pytest
import torch

from rl_core.grpo.loss import LossConfig, grpo_loss, kl_penalty, ppo_clip_loss, tis_weights

T = torch.tensor
LN2 = math.log(2.0)


@pytest.mark.parametrize(
    ("ratio", "adv", "eps", "eps_high", "loss", "clipped"),
    [
        pytest.param(1.5, 1.0, 0.2, None, -1.2, 1.0, id="pos-adv-clipped-high"),
        pytest.param(1.5, 1.0, 0.2, 0.28, -1.28, 1.0, id="asymmetric-high"),
        pytest.param(0.5, -1.0, 0.2, 0.28, 0.8, 1.0, id="neg-adv-clipped-low"),
        pytest.param(1.5, -1.0, 0.2, 0.28, 1.5, 0.0, id="neg-adv-not-clipped"),
        pytest.param(1.1, 2.0, 0.2, None, -2.2, 0.0, id="inside-trust-region"),
    ],
)
def test_ppo_clip(ratio, adv, eps, eps_high, loss, clipped):
    out, frac = ppo_clip_loss(
        T([math.log(ratio)]), T([0.0]), T([adv]), eps_clip=eps, eps_clip_high=eps_high
    )
    assert out.item() == pytest.approx(loss, rel=1e-5)
    assert frac.item() == clipped


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        pytest.param("k1", -LN2, id="k1"),
        pytest.param("k2", 0.5 * LN2**2, id="k2"),
        pytest.param("low_var_kl", 2.0 - LN2 - 1.0, id="low_var_kl"),
    ],
)
def test_kl(kind, expected):
    # policy p = 1/2... expressed through log-probs: logp = 0, ref = ln 2
    assert kl_penalty(T([0.0]), T([LN2]), kind).item() == pytest.approx(expected, rel=1e-5)


def test_kl_zero_when_equal_and_unknown_type():
    for kind in ("k1", "k2", "low_var_kl"):
        assert kl_penalty(T([-1.3]), T([-1.3]), kind).item() == 0.0
    with pytest.raises(ValueError, match="kl-loss-type"):
        kl_penalty(T([0.0]), T([0.0]), "k3")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("old", "rollout", "expected"),
    [
        pytest.param(0.0, math.log(0.25), 2.0, id="truncated-at-clip"),
        pytest.param(0.0, LN2, 0.5, id="below-one"),
        pytest.param(-1.0, -1.0, 1.0, id="same-numerics"),
    ],
)
def test_tis(old, rollout, expected):
    assert tis_weights(T([old]), T([rollout]), clip=2.0).item() == pytest.approx(expected)


def test_token_level_aggregation_over_global_batch():
    """Masked tokens do not count, and the divisor is the global batch's token count."""
    logp = T([math.log(1.5), 0.0, 0.0], requires_grad=True)
    parts = grpo_loss(
        logp,
        T([0.0, 0.0, 0.0]),
        T([1.0, 1.0, -1.0]),
        T([1.0, 1.0, 0.0]),
        LossConfig(eps_clip=0.2),
        total_tokens=4,
    )
    # tokens: -1.2 (clipped), -1.0, masked → (-1.2 - 1.0) / 4
    assert parts.loss.item() == pytest.approx(-2.2 / 4)
    assert parts.tokens == 2 and parts.clipfrac_sum == 1
    parts.loss.backward()
    assert logp.grad is not None
    assert logp.grad[2].item() == 0.0  # masked token gets no gradient
    assert logp.grad[0].item() == 0.0  # clipped token gets no gradient
    assert logp.grad[1].item() == pytest.approx(-1.0 / 4)


def test_kl_and_tis_enter_the_loss():
    cfg = LossConfig(
        eps_clip=0.2,
        use_kl_loss=True,
        kl_loss_coef=0.5,
        kl_loss_type="k2",
        use_tis=True,
        tis_clip=2.0,
    )
    parts = grpo_loss(
        T([0.0]),
        T([0.0]),
        T([1.0]),
        T([1.0]),
        cfg,
        total_tokens=1,
        ref_logprobs=T([LN2]),
        rollout_logprobs=T([math.log(0.25)]),
    )
    # pg = -1 * ratio 1 = -1, times TIS weight 2 → -2; plus 0.5 * k2 = 0.5 * 0.5 * ln2^2
    assert parts.loss.item() == pytest.approx(-2.0 + 0.25 * LN2**2, rel=1e-5)
    assert parts.tis_sum == pytest.approx(2.0)


def test_kl_coef_zero_needs_no_reference():
    cfg = LossConfig(use_kl_loss=True, kl_loss_coef=0.0)
    parts = grpo_loss(T([0.0]), T([0.0]), T([1.0]), T([1.0]), cfg, total_tokens=1)
    assert parts.loss.item() == pytest.approx(-1.0)


@pytest.mark.parametrize(
    ("cfg", "kwargs", "match"),
    [
        pytest.param(LossConfig(use_tis=True), {}, "use-tis", id="tis-without-rollout-logprobs"),
        pytest.param(
            LossConfig(use_kl_loss=True, kl_loss_coef=0.1), {}, "reference", id="kl-no-ref"
        ),
        pytest.param(LossConfig(), {"total_tokens": 0}, "total_tokens", id="no-tokens"),
    ],
)
def test_loss_errors(cfg, kwargs, match):
    kwargs = {"total_tokens": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        grpo_loss(T([0.0]), T([0.0]), T([1.0]), T([1.0]), cfg, **kwargs)
