"""GRPO advantages against values worked out by hand."""

import math

import pytest

from rl_core.grpo.advantages import grpo_advantages

S3 = math.sqrt(1 / 3)  # Bessel std of {1, 0, 1, 0} and of {1, 0, 1}


@pytest.mark.parametrize(
    ("rewards", "groups", "normalize", "expected"),
    [
        pytest.param([1, 0, 1, 0], [0] * 4, True, [0.5 / S3, -0.5 / S3] * 2, id="binary-group"),
        pytest.param(
            [1.0, None, 0.0, 1.0],
            [0] * 4,
            True,
            [(1 / 3) / S3, 0.0, -(2 / 3) / S3, (1 / 3) / S3],
            id="judge-error-left-out-of-mean-and-std",
        ),
        pytest.param([1, 0, 0], [0] * 3, False, [2 / 3, -1 / 3, -1 / 3], id="mean-only"),
        pytest.param([1, 1, 1], [0] * 3, True, [0.0] * 3, id="all-equal-is-zero"),
        pytest.param([1, None], [0, 0], True, [0.0, 0.0], id="single-valid-no-baseline"),
        pytest.param(
            [1, 0, 3, 5], [0, 0, 1, 1], False, [0.5, -0.5, -1.0, 1.0], id="groups-independent"
        ),
    ],
)
def test_grpo_advantages(rewards, groups, normalize, expected):
    adv = grpo_advantages(rewards, groups, normalize_std=normalize, eps=0.0)
    assert adv.values == pytest.approx(expected, abs=1e-9)
    assert adv.valid == [r is not None for r in rewards]


def test_judge_error_is_not_a_zero():
    """Counting the failure as 0 would change the other samples' advantages."""
    masked = grpo_advantages([1.0, None, 0.0, 1.0], [0] * 4).values
    as_zero = grpo_advantages([1.0, 0.0, 0.0, 1.0], [0] * 4).values
    assert masked[0] != pytest.approx(as_zero[0])


def test_degenerate_groups_counted():
    adv = grpo_advantages([1, 1, 0, 1, None, None], [0, 0, 1, 1, 2, 2])
    assert adv.num_groups == 3
    assert adv.num_degenerate_groups == 2  # group 0 all equal, group 2 all failed


@pytest.mark.parametrize(
    ("rewards", "groups"),
    [
        pytest.param([1.0], [0, 1], id="length-mismatch"),
        pytest.param([float("nan")], [0], id="nan-reward"),
    ],
)
def test_bad_input(rewards, groups):
    with pytest.raises(ValueError):
        grpo_advantages(rewards, groups)
