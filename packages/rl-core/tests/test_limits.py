"""rl-core's deadlines nest: a wait that holds another is the longer one, so the inner wait's own
error (which names what hung) arrives first."""

from __future__ import annotations

import pytest

from genrm_client import ClientSettings
from rl_core import limits


@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        pytest.param("TRAINER_START_TIMEOUT_S", "PROCESS_GROUP_TIMEOUT_S", id="start>join"),
        pytest.param("TRAINER_START_TIMEOUT_S", "ENGINE_START_TIMEOUT_S", id="start>load"),
        pytest.param("TRAINER_CALL_TIMEOUT_S", "PROCESS_GROUP_TIMEOUT_S", id="call>collective"),
        pytest.param("TRAINER_CALL_TIMEOUT_S", "WEIGHT_GROUP_TIMEOUT_S", id="broadcast>group"),
        pytest.param("ENGINE_CALL_TIMEOUT_S", "WEIGHT_GROUP_TIMEOUT_S", id="update>group"),
        pytest.param("TRAINER_CALL_TIMEOUT_S", "TRAINER_PROBE_TIMEOUT_S", id="call>probe"),
    ],
)
def test_an_outer_wait_is_longer_than_the_one_it_holds(outer: str, inner: str) -> None:
    assert getattr(limits, outer) > getattr(limits, inner)


def test_a_reward_call_outlasts_the_clients_own_deadline() -> None:
    # the client's retries fit inside one reward call; past it the sample is a judge error
    assert ClientSettings.model_fields["timeout_s"].default < limits.REWARD_TIMEOUT_S


def test_every_deadline_is_a_positive_number_of_seconds() -> None:
    for name in limits.__all__:
        assert getattr(limits, name) > 0, name
