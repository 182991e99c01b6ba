"""genrm-serve's deadlines nest: a wait that holds another is the longer one, so the inner
wait's own error (which names what hung) arrives first. A request's waits (slot, engine call,
the engine actor's queue) are not here: they take what is left of ``REQUEST_TIMEOUT_S``
(``test_router``: ``..._one_deadline_across_the_slot_wait_and_the_engine_call``)."""

from __future__ import annotations

import pytest

from genrm_client import ClientSettings
from genrm_serve import limits
from genrm_serve.engines import worker
from genrm_serve.serve_args import ServeArgs


@pytest.mark.parametrize(
    ("outer", "inner"),
    [
        pytest.param("ENGINE_START_TIMEOUT_S", "MODEL_LOCK_TIMEOUT_S", id="start>model-lock"),
        pytest.param("WEIGHT_UPDATE_TIMEOUT_S", "WEIGHT_GROUP_TIMEOUT_S", id="update>group"),
        pytest.param("SLEEP_TIMEOUT_S", "DRAIN_TIMEOUT_S", id="sleep>drain"),
        pytest.param("SLEEP_TIMEOUT_S", "SGLANG_FLUSH_DEADLINE_S", id="sleep>sglang-flush"),
        pytest.param("PROBE_TIMEOUT_S", "SGLANG_PROBE_TIMEOUT_S", id="probe>sglang-probe"),
    ],
)
def test_an_outer_wait_is_longer_than_the_one_it_holds(outer: str, inner: str) -> None:
    assert getattr(limits, outer) > getattr(limits, inner)


def test_the_engine_actors_own_queue_wait_is_no_longer_than_a_request() -> None:
    # a request the router sends carries less; one sent directly gets at most this
    assert worker.DEFAULT_REQUEST_TIMEOUT_S <= limits.REQUEST_TIMEOUT_S
    assert ServeArgs(api_key=None).request_timeout_s == limits.REQUEST_TIMEOUT_S


def test_the_clients_default_deadline_is_no_longer_than_a_request() -> None:
    # past the service's deadline a call gets a 504, which the client retries: a second full wait
    default = ClientSettings.model_fields["timeout_s"].default
    assert default <= limits.REQUEST_TIMEOUT_S


def test_every_deadline_is_a_positive_number_of_seconds() -> None:
    for name in dir(limits):
        if name.endswith("_S") and name.isupper():
            assert getattr(limits, name) > 0, name
