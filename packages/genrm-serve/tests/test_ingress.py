"""``genrm_serve.ingress``'s own pure parts; its HTTP behaviour is ``test_service_http.py``."""

from __future__ import annotations

from genrm_client.types import SamplingParams
from genrm_serve.ingress import _sampling


def test_request_sampling_overrides_the_instance_and_merges_template_kwargs() -> None:
    base = SamplingParams(
        temperature=0.1, top_p=1.0, max_response_len=4096, chat_template_kwargs={"a": 1}
    )
    merged = _sampling(base, SamplingParams(temperature=0.7, chat_template_kwargs={"b": 2}))
    assert merged.temperature == 0.7 and merged.max_response_len == 4096
    assert merged.chat_template_kwargs == {"a": 1, "b": 2}
    assert _sampling(base, None) is base
