"""Settings come from any attribute-bearing args; bad values are named."""

import argparse

import pytest
from rewards_doubles import Args

from genrm_rewards import RewardArgs, RewardConfigError, resolve_args


def test_defaults_from_an_object_without_our_fields() -> None:
    assert resolve_args(object()) == RewardArgs()
    assert resolve_args(None) == RewardArgs()


def test_argparse_none_means_default_and_json_strings_parse() -> None:
    ns = argparse.Namespace(
        rule_gate=None,
        verdict_cache=False,
        agentic_route_keys='{"plan": "planner_judge"}',
        reward_sampling_params='{"temperature": 0.1, "max_response_len": 8}',
        unrelated_flag=3,
    )
    settings = resolve_args(ns)
    assert settings.rule_gate is False and settings.verdict_cache is False
    assert settings.agentic_route_keys == {"plan": "planner_judge"}
    assert settings.reward_sampling_params is not None
    assert settings.reward_sampling_params.max_response_len == 8


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dual_combine": "avg"}, r"args.dual_combine='avg' is invalid.*'product'"),
        ({"max_answer_chars": 3}, r"args.max_answer_chars=3 is invalid.*greater than or equal"),
        ({"reward_sampling_params": '{"max_tokens": 4}'}, r"reward_sampling_params.max_tokens"),
        (
            {"agentic_route_keys": "{plan: x}"},
            r"args.agentic_route_keys='\{plan: x\}' is not valid",
        ),
    ],
)
def test_bad_values_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(RewardConfigError, match=message):
        resolve_args(Args(**kwargs))
