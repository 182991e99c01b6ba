"""The hf engine's rows and chunks without a model: the token budget, groups kept whole, and
what a finished row reports (EOS, then a stop string, else its length)."""

from __future__ import annotations

import pytest
import torch

from genrm_client.types import SamplingParams
from genrm_serve.engines.base import EngineRequest
from genrm_serve.engines.hf.batching import Row, added_cost, chunk_cost, split_chunks


def _row(prompt: list[int], max_new: int = 1, stop: list[str] | None = None) -> Row:
    request = EngineRequest(
        sampling=SamplingParams(temperature=0.0, max_response_len=max_new, stop=stop),
        prompt_token_ids=prompt,
        return_tokens=True,
    )
    return Row(request=request, prompt=prompt, max_new=max_new, seed=0)


def _groups(groups: int, size: int, shared: int, own: int) -> list[Row]:
    """``groups`` × ``size`` rows: each group shares ``shared`` tokens, each row has ``own``."""
    return [
        _row([100 + g] + [g] * (shared - 1) + [1000 + g * size + i] * own)
        for g in range(groups)
        for i in range(size)
    ]


def test_a_shared_prefix_counts_once_and_a_decoding_row_holds_its_cache() -> None:
    a, b = _row([1, 2, 3, 4]), _row([1, 2, 3, 9])
    assert added_cost(a, None) == 4
    assert added_cost(b, a) == 1  # only the token after the shared prefix
    assert chunk_cost([a, b]) == 5
    decoding = _row([1, 2, 3, 9], max_new=6)
    assert added_cost(decoding, a) == 1 + 4 + 6  # plus its static cache: prompt + new tokens


@pytest.mark.parametrize(
    ("max_rows", "max_tokens", "sizes"),
    [
        pytest.param(64, 10_000, [18], id="one-chunk"),
        pytest.param(8, 10_000, [6, 6, 6], id="row-limit-cuts-between-groups"),
        pytest.param(64, 2 * 45, [6, 6, 6], id="token-limit-cuts-between-groups"),
    ],
)
def test_chunks_keep_groups_whole(max_rows: int, max_tokens: int, sizes: list[int]) -> None:
    rows = _groups(3, 6, shared=40, own=1)
    rows = rows[::-1]  # arrival order is not prompt order
    chunks = split_chunks(rows, max_rows, max_tokens)
    assert [len(c) for c in chunks] == sizes
    assert all(len({r.prompt[0] for r in c}) == 1 for c in chunks) or len(chunks) == 1
    assert all(chunk_cost(c) <= max_tokens for c in chunks)
    assert sorted(id(r) for c in chunks for r in c) == sorted(id(r) for r in rows)


def _finish(row: Row, tokens: list[int], eos: int = 0) -> Row:
    t = torch.tensor(tokens)
    lp = torch.linspace(-1.0, -2.0, len(tokens))
    row.finish(t, lp, lp * 2, eos_ids={eos}, decode=lambda ids: "".join(chr(96 + i) for i in ids))
    return row


def test_a_finished_row_stops_at_eos_then_a_stop_string_else_its_length() -> None:
    eos = _finish(_row([1], max_new=4), [1, 2, 0])
    assert (eos.finish_reason, eos.text) == ("stop", "ab")
    stop = _finish(_row([1], max_new=4, stop=["c"]), [1, 2, 3, 4])
    assert (stop.finish_reason, stop.text) == ("stop", "ab")
    assert stop.hits_stop("abc") and not stop.hits_stop("ab")
    length = _finish(_row([1], max_new=4), [1, 2, 3, 4])
    assert (length.finish_reason, length.text) == ("length", "abcd")


def test_a_row_reports_its_tokens_and_who_answered() -> None:
    row = _finish(_row([7, 8], max_new=4), [1, 2, 0])
    row.verdict_prob = 0.75
    out = row.output(0.5, 3, {"engine_id": "q/0"})
    assert (out.text, out.finish_reason, out.prompt_tokens, out.completion_tokens) == (
        "ab",
        "stop",
        2,
        3,
    )
    assert out.weight_version == 3 and out.latency_s == 0.5
    assert out.token_ids == [1, 2, 0] and out.logprobs is not None and len(out.logprobs) == 3
    assert out.extra == {
        "engine_id": "q/0",
        "verdict_prob": 0.75,
        "prompt_token_ids": [7, 8],
        "cached_prompt_tokens": 0,  # computed alone (no other row shared its prompt)
    }
