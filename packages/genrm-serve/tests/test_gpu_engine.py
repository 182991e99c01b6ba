"""The hf engine on a CUDA GPU in bf16: sleep / wake keeps the outputs and gives the memory back,
an asleep engine refuses work, and a share of the GPU too small for the weights fails the start.

A random-weight Qwen3 model (4 layers × 1024, vocabulary 151,936 so the embedding has a real
model's size; ≈ 0.4 GB in bf16) with the tiny tokenizer. Memory is read with
``torch.cuda.memory_allocated`` (this process's tensors), so other processes on the GPU do not
disturb it. Skipped without CUDA (the root conftest).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from genrm_client.types import SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import EngineAsleepError, EngineError, EngineRequest
from genrm_serve.engines.hf import HFEngine, model_bytes
from genrm_serve.testing import build_random_qwen3

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _spec(path: Path, fraction: float, **cfg: Any) -> InstanceSpec:
    return InstanceSpec(
        route_key="judge",
        model_path=str(path),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(
            device="cuda",
            max_context_len=1024,
            max_batch_size=16,
            mem_fraction_static=fraction,
            **cfg,
        ),
    )


def _greedy_requests() -> list[EngineRequest]:
    g = torch.Generator().manual_seed(1)
    sampling = SamplingParams(temperature=0.0, max_response_len=8).merged_over(DEFAULT_SAMPLING)
    return [
        EngineRequest(
            sampling=sampling,
            prompt_token_ids=torch.randint(10, 500, (24,), generator=g).tolist(),
            return_tokens=True,
        )
        for _ in range(4)
    ]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_qwen3(
        tmp_path_factory.mktemp("qwen3-gpu"), layers=4, hidden=1024, mlp=3072, heads=8, kv_heads=4
    )


@pytest.fixture
async def engine(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[HFEngine]:
    # compiled layers cost ~15 s on the first batch; eager runs the same weights
    monkeypatch.setenv("GENRM_HF_COMPILE", "0")
    torch.cuda.empty_cache()
    e = HFEngine(_spec(qwen3_dir, 0.3), "judge/0")
    yield e
    if e._host is not None and e.model is not None:
        e._host.close()  # unpin the host buffers
    await e.shutdown()
    del e
    torch.cuda.empty_cache()


async def test_sleep_frees_the_weights_and_wake_gives_the_same_greedy_outputs(
    engine: HFEngine,
) -> None:
    base = torch.cuda.memory_allocated()
    await engine.start()
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16
    weights = model_bytes(engine.model)
    assert engine.memory_budget["weights_bytes"] == weights
    assert weights > 300e6  # the real-size embedding is there
    requests = _greedy_requests()
    before = [o.token_ids for o in await engine.generate(requests)]
    assert all(before)
    # the baseline: greedy is repeatable awake (else the comparison after wake means nothing)
    assert [o.token_ids for o in await engine.generate(requests)] == before
    bits = {n: p.detach().cpu().clone() for n, p in engine.model.named_parameters()}
    awake = torch.cuda.memory_allocated()
    assert awake - base >= weights

    await engine.sleep()
    asleep = torch.cuda.memory_allocated()
    assert engine.state == "asleep"
    assert awake - asleep >= weights  # every weight left the GPU
    assert asleep - base < 0.25 * weights, (base, awake, asleep, weights)
    with pytest.raises(EngineAsleepError):
        await engine.generate(requests)
    with pytest.raises(EngineAsleepError):
        await engine.update_weights({}, version=1)

    await engine.wake()
    assert engine.state == "awake"
    assert torch.cuda.memory_allocated() - base >= weights
    for n, p in engine.model.named_parameters():
        assert p.device.type == "cuda", n
        assert torch.equal(p.detach().cpu(), bits[n]), n
    assert [o.token_ids for o in await engine.generate(requests)] == before

    # a second round reuses the pinned host buffers of the first
    assert engine._host is not None
    name = next(iter(engine._host._buffers))
    first = engine._host.buffer(name).data_ptr()
    await engine.sleep()
    assert engine._host.buffer(name).data_ptr() == first
    await engine.wake()
    assert [o.token_ids for o in await engine.generate(requests)] == before


async def test_decode_through_cuda_graphs_equals_the_same_steps_run_eagerly(
    engine: HFEngine,
) -> None:
    """Rows of different lengths (greedy and seeded sampled) decode through captured graphs,
    recaptured as the batch compacts, and give the tokens and log-probs of the same fixed-shape
    steps run eagerly."""
    await engine.start()
    g = torch.Generator().manual_seed(2)
    requests = []
    for i in range(12):
        params = SamplingParams(
            temperature=1.0 if i % 2 else 0.0,
            top_p=0.9 if i % 4 == 1 else None,
            seed=7 + i,
            max_response_len=[8, 40, 12, 24][i % 4],
        )
        requests.append(
            EngineRequest(
                sampling=params.merged_over(DEFAULT_SAMPLING),
                prompt_token_ids=torch.randint(10, 500, (20 + 3 * i,), generator=g).tolist(),
                return_tokens=True,
            )
        )
    engine._eos_ids = frozenset()  # every row runs its full length
    before = engine.counters["decode_graphs"]
    graphed = await engine.generate(requests)
    captures = engine.counters["decode_graphs"] - before
    assert captures >= 2, captures  # the first batch, and again after it compacted
    engine.static_decode, engine.decode_graphs = True, False
    try:
        eager = await engine.generate(requests)
    finally:
        engine.static_decode, engine.decode_graphs = None, True
    assert engine.counters["decode_graphs"] - before == captures
    for a, b, req in zip(graphed, eager, requests, strict=True):
        assert a.completion_tokens == req.sampling.max_response_len
        assert a.token_ids == b.token_ids
        assert a.raw_logprobs == b.raw_logprobs and a.logprobs == b.logprobs


def _eager_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Plain transformers, eager, teacher-forced on ``tokens``: per reply position the
    log-probabilities over the vocabulary, ``[len(tokens), vocab]``."""
    ids = torch.tensor([prompt + tokens[:-1]], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 :].float()
    return torch.log_softmax(logits, dim=-1)


async def test_compiled_layers_are_one_graph_each_and_give_the_eager_outputs(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's own compiled layers (Inductor, the attention as one opaque op): no graph
    break, and verdict rows (one token) and decoded rows (8 tokens, through captured decode
    graphs) are greedy for the same model run eagerly: each token within bf16 noise (0.05 nats)
    of the eager argmax at its position, its log-prob within 0.05 of the eager one. (Token
    equality is not the test: a random model's near-ties flip under another kernel's rounding.)
    """
    import torch._dynamo.utils

    monkeypatch.delenv("GENRM_HF_COMPILE", raising=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    requests = _greedy_requests()
    g = torch.Generator().manual_seed(5)
    one = SamplingParams(temperature=0.0, max_response_len=1).merged_over(DEFAULT_SAMPLING)
    requests += [
        EngineRequest(
            sampling=one,
            prompt_token_ids=torch.randint(10, 500, (30 + 7 * i,), generator=g).tolist(),
            return_tokens=True,
        )
        for i in range(4)
    ]
    e = HFEngine(_spec(qwen3_dir, 0.3), "judge/compiled")
    await e.start()
    try:
        assert e._compiled_layers
        compiled = await e.generate(requests)
        compiled_small = await e.generate(requests[-1:])  # another shape: no recompile break
        assert not torch._dynamo.utils.counters["graph_break"]
        for layer in e._compiled_layers:
            layer._compiled_call_impl = None
        for out, req in zip(compiled, requests, strict=True):
            assert req.prompt_token_ids is not None and out.token_ids and out.raw_logprobs
            eager = _eager_logprobs(e.model, req.prompt_token_ids, out.token_ids)
            picked = eager[torch.arange(len(out.token_ids)), out.token_ids]
            assert (eager.max(dim=-1).values - picked).max() < 0.05, out.token_ids
            assert torch.allclose(torch.tensor(out.raw_logprobs), picked.cpu(), atol=0.05)
    finally:
        torch._dynamo.reset()
        await e.shutdown()
    assert compiled_small[0].token_ids == compiled[-1].token_ids


async def test_weights_larger_than_the_share_fail_the_start_naming_the_fraction(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A share of ≈ 128 MiB, whatever the GPU's size: less than the ≈ 0.4 GB of weights."""
    monkeypatch.setenv("GENRM_HF_COMPILE", "0")
    torch.cuda.empty_cache()
    fraction = float(f"{(1 << 27) / torch.cuda.get_device_properties(0).total_memory:.2g}")
    base = torch.cuda.memory_allocated()
    engine = HFEngine(_spec(qwen3_dir, fraction), "judge/small-share")
    named = rf"mem_fraction_static={re.escape(str(fraction))} .* weights alone take"
    with pytest.raises(EngineError, match=named):
        await engine.start()
    assert engine.state != "awake"
    # refused before the weights took device memory
    assert torch.cuda.memory_allocated() == base


async def test_buffers_reserved_at_start_are_where_the_first_sleep_goes(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sleep_buffers="start"`` (what rl-core asks of colocated engines): the pinned host
    buffers exist once the engine has loaded, and the first sleep copies into them."""
    monkeypatch.setenv("GENRM_HF_COMPILE", "0")
    e = HFEngine(_spec(qwen3_dir, 0.3, sleep_buffers="start"), "judge/0")
    await e.start()
    try:
        assert e._host is not None and not e._host.offloaded
        reserved_bytes = e._host.host_bytes
        assert reserved_bytes >= model_bytes(e.model)
        reserved = {n: e._host.buffer(n).data_ptr() for n in e._host._buffers}
        await e.sleep()
        assert {n: e._host.buffer(n).data_ptr() for n in reserved} == reserved
        assert e._host.host_bytes == reserved_bytes  # the sleep allocated nothing more
        await e.wake()
    finally:
        if e._host is not None:
            e._host.close()
        await e.shutdown()
        torch.cuda.empty_cache()
