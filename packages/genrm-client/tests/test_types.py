"""The wire schema rejects what a user would otherwise lose silently."""

import pytest
from pydantic import ValidationError

from genrm_client.types import GenerateRequest, SamplingParams


def test_unknown_sampling_key_is_named() -> None:
    with pytest.raises(ValidationError, match="max_tokens"):
        SamplingParams.model_validate({"temperature": 0.2, "max_tokens": 4})


def test_request_override_merges_over_instance_defaults() -> None:
    base = SamplingParams(temperature=0.1, top_p=1.0, max_response_len=4096)
    merged = SamplingParams(temperature=0.7).merged_over(base)
    assert (merged.temperature, merged.top_p, merged.max_response_len) == (0.7, 1.0, 4096)


def test_empty_messages_rejected() -> None:
    with pytest.raises(ValidationError, match="messages"):
        GenerateRequest.model_validate({"messages": []})
