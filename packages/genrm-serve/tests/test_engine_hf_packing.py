"""Packed prefill and batched sampling of the hf engine against plain transformers (fp32, CPU)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from genrm_client.types import Message, SamplingParams
from genrm_serve.config import DEFAULT_SAMPLING, EngineConfig, InstanceSpec
from genrm_serve.engines.base import (
    EngineBatchError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
)
from genrm_serve.engines.hf import HFEngine, VerdictUnavailableError
from genrm_serve.engines.hf.packing import build_forest, build_plan
from genrm_serve.engines.hf.sampling import RowSampling, sample
from genrm_serve.testing import build_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HFEngine]:
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(build_tiny_model(tmp_path_factory.mktemp("tiny"))),
        num_gpus=1,
        engine="hf",
        # exact comparisons with plain transformers: fp32 on CPU on any host
        engine_config=EngineConfig(max_batch_size=64, device="cpu", dtype="float32"),
    )
    eng = HFEngine(spec, "judge/0")
    asyncio.run(eng.start())
    assert eng.dtype == torch.float32
    yield eng
    asyncio.run(eng.shutdown())


def _ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(10, 400, (n,), generator=gen).tolist()


def _mixed_prompts() -> list[list[int]]:
    """Three GRPO-like groups differing from their first token, of different prefix and answer
    lengths; distinct prompts; a duplicate; a prompt that is a prefix of another."""
    gen = torch.Generator().manual_seed(7)
    prompts = []
    for g, (shared, size) in enumerate([(40, 4), (23, 3), (57, 2)]):
        head = [5 + g, *_ids(gen, shared - 1)]
        prompts += [head + _ids(gen, 3 + 2 * s + g) for s in range(size)]
    prompts += [[20 + i, *_ids(gen, 12 + 5 * i)] for i in range(3)]
    prompts.append(list(prompts[1]))  # the same prompt twice
    prompts.append(prompts[0][:30])  # ends inside a shared run
    return prompts


def _request(prompt: list[int], max_new: int, stop: list[str] | None = None) -> EngineRequest:
    params = SamplingParams(temperature=0.0, max_response_len=max_new, stop=stop)
    return EngineRequest(
        sampling=params.merged_over(DEFAULT_SAMPLING), prompt_token_ids=prompt, return_tokens=True
    )


@torch.inference_mode()
def _plain_greedy(
    engine: HFEngine, prompt: list[int], max_new: int
) -> tuple[list[int], list[float]]:
    """Greedy tokens and their raw log-probs, one full forward of transformers per token."""
    tokens: list[int] = []
    logprobs: list[float] = []
    for _ in range(max_new):
        ids = torch.tensor([prompt + tokens])
        logits = engine.model(input_ids=ids, use_cache=False).logits[0, -1].float()
        token = int(logits.argmax())
        tokens.append(token)
        logprobs.append(float(torch.log_softmax(logits, -1)[token]))
        if token in engine._eos_ids:
            break
    return tokens, logprobs


def _expected(
    engine: HFEngine, tokens: list[int], stop: list[str] | None
) -> tuple[list[int], str, str]:
    """(tokens, finish_reason, text) the service promises, checking token by token: an
    end-of-sequence token first, then a stop string in the text so far, else the length."""
    decode = engine.tokenizer.decode
    for k in range(1, len(tokens) + 1):
        if tokens[k - 1] in engine._eos_ids:
            return tokens[:k], "stop", decode(tokens[: k - 1], skip_special_tokens=True)
        text = decode(tokens[:k], skip_special_tokens=True)
        cut = min((i for s in stop or [] if (i := text.find(s)) >= 0), default=None)
        if cut is not None:
            return tokens[:k], "stop", text[:cut]
    return tokens, "length", decode(tokens, skip_special_tokens=True)


def _check(
    engine: HFEngine, out: EngineOutput, prompt: list[int], max_new: int, stop: list[str] | None
) -> None:
    tokens, logprobs = _plain_greedy(engine, prompt, max_new)
    expected, finish, text = _expected(engine, tokens, stop)
    assert (out.token_ids, out.finish_reason, out.text) == (expected, finish, text)
    assert out.raw_logprobs is not None and out.logprobs == out.raw_logprobs  # greedy
    assert torch.allclose(
        torch.tensor(out.raw_logprobs), torch.tensor(logprobs[: len(expected)]), atol=1e-4
    )


@pytest.mark.parametrize("max_new", [1, 4])
async def test_packed_batch_equals_plain_transformers_row_by_row(
    engine: HFEngine, max_new: int
) -> None:
    prompts = _mixed_prompts()
    reqs = [_request(p, max_new if i % 3 else 1) for i, p in enumerate(prompts)]
    shared0, forward0 = engine.counters["prefix_shared_tokens"], engine.counters["forward_tokens"]
    outs = await engine.generate(reqs)
    unique = build_plan(prompts, torch.device("cpu")).num_tokens
    assert engine.counters["prefix_shared_tokens"] - shared0 == sum(map(len, prompts)) - unique
    if max_new == 1:  # one-pass verdicts: the prefill alone, no decode step
        assert engine.counters["forward_tokens"] - forward0 == unique
    for out, req, prompt in zip(outs, reqs, prompts, strict=True):
        assert out.prompt_tokens == len(prompt)
        _check(engine, out, prompt, req.sampling.max_response_len or 1, None)


def _mixed_decode_requests(prompts: list[list[int]]) -> list[EngineRequest]:
    """Rows that stop at different steps: greedy and seeded sampled rows (top-k, top-p), lengths
    from 2 to 12 new tokens, a stop string on some."""
    reqs = []
    for i, p in enumerate(prompts):
        sampled = i % 2 == 1
        params = SamplingParams(
            temperature=0.9 if sampled else 0.0,
            top_p=0.8 if i % 4 == 1 else None,
            top_k=20 if i % 4 == 3 else None,
            seed=100 + i if sampled else None,
            max_response_len=[2, 12, 3, 9, 5, 12][i % 6],
            stop=["e"] if i % 5 == 4 else None,
        )
        reqs.append(
            EngineRequest(
                sampling=params.merged_over(DEFAULT_SAMPLING),
                prompt_token_ids=p,
                return_tokens=True,
            )
        )
    return reqs


async def test_fixed_shape_decode_equals_the_shrinking_batch(engine: HFEngine) -> None:
    """The decode of a CUDA graph (fixed shape: finished rows ride along as dead slots until half
    the batch is dead, then the batch is compacted) gives every row what the default decode,
    whose batch shrinks at every finish, gives it; here it runs eagerly on CPU."""
    prompts = _mixed_prompts()
    reqs = _mixed_decode_requests(prompts)
    before = engine.counters["forward_tokens"]
    default = await engine.generate(reqs)
    shrinking = engine.counters["forward_tokens"] - before
    engine.static_decode = True
    try:
        before = engine.counters["forward_tokens"]
        fixed = await engine.generate(reqs)
        riding = engine.counters["forward_tokens"] - before
    finally:
        engine.static_decode = None
    assert riding > shrinking  # dead slots were computed: the fixed-shape path ran
    assert len({o.completion_tokens for o in default}) > 3  # rows stopped at different steps
    for a, b in zip(default, fixed, strict=True):
        assert (a.token_ids, a.finish_reason, a.text) == (b.token_ids, b.finish_reason, b.text)
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        assert torch.allclose(torch.tensor(a.raw_logprobs), torch.tensor(b.raw_logprobs), atol=1e-5)
    for out, req, prompt in zip(fixed, reqs, prompts, strict=True):
        if not req.sampling.temperature:
            _check(engine, out, prompt, req.sampling.max_response_len or 1, req.sampling.stop)


async def test_stop_strings_in_a_packed_batch(engine: HFEngine) -> None:
    prompts = _mixed_prompts()
    plain = [_plain_greedy(engine, p, 4)[0] for p in prompts]
    texts = [engine.tokenizer.decode(t, skip_special_tokens=True) for t in plain]
    # a stop string taken from inside one row's 4-token reply, applied to every row
    source = next(
        t
        for t, toks in zip(texts, plain, strict=True)
        if len(t.strip()) > 3 and toks[-1] not in engine._eos_ids
    )
    stop = [source.strip()[1:3]]
    outs = await engine.generate([_request(p, 4, stop) for p in prompts])
    assert any(o.finish_reason == "stop" and o.completion_tokens < 4 for o in outs)
    for out, prompt in zip(outs, prompts, strict=True):
        _check(engine, out, prompt, 4, stop)


async def test_multi_group_batch_reports_shared_prefix_tokens(engine: HFEngine) -> None:
    """Groups that differ from the first token share nothing batch-wide, everything in-group."""
    gen = torch.Generator().manual_seed(3)
    prompts = []
    for g in range(4):
        head = [5 + g, *_ids(gen, 63)]
        prompts += [head + _ids(gen, 8) for _ in range(4)]
    prompts.append([4, *_ids(gen, 20)])  # a loner shares nothing
    before = engine.counters["prefix_shared_tokens"]
    outs = await engine.generate([_request(p, 1) for p in prompts])
    assert engine.counters["prefix_shared_tokens"] - before == 4 * 3 * 64
    # each row says how much of its prompt was computed with others (its group's 64 tokens)
    assert [o.extra["cached_prompt_tokens"] for o in outs] == [64] * 16 + [0]


async def test_a_compiled_layer_is_one_graph_and_gives_the_same_outputs(tmp_path: Path) -> None:
    """Under ``torch.compile`` the attention is one opaque op, so each decoder layer compiles to
    one graph with no break: a break around the attention split every layer into four compiled
    regions, whose host cost made a small batch on an H200 take three times its GPU time.
    Greedy outputs (one-pass verdicts and decoded rows) stay those of plain transformers, and
    the compiled model used without a plan is plain transformers.
    The compiler's graphs without code generation (``aot_eager``): what is tested is the
    tracing, which is the same on a GPU."""
    import torch._dynamo.utils

    spec = InstanceSpec(
        route_key="judge",
        model_path=str(build_tiny_model(tmp_path / "tiny")),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(max_batch_size=64, device="cpu", dtype="float32"),
    )
    eng = HFEngine(spec, "judge/compiled")
    await eng.start()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        for layer in eng.model.model.layers:
            layer.compile(dynamic=True, backend="aot_eager")
        prompts = _mixed_prompts()
        reqs = [_request(p, 4 if i % 3 else 1) for i, p in enumerate(prompts)]
        outs = await eng.generate(reqs)
        outs_again = await eng.generate(reqs[:3])  # another batch shape: no new graph break
        assert not torch._dynamo.utils.counters["graph_break"]
        # the compiled model without a plan (model.generate, a test's reference) is plain SDPA
        one = torch.tensor([prompts[0]])  # batch 1, as the packed sequence
        padded = torch.tensor([prompts[0], [0] * 5 + prompts[0][5:]])
        mask = torch.ones_like(padded)
        mask[1, :5] = 0  # left padding: the attention mask reaches the op

        def plain() -> list[torch.Tensor]:
            with torch.no_grad():
                return [
                    eng.model(input_ids=one).logits,
                    eng.model(input_ids=padded, attention_mask=mask).logits[:, 5:],
                ]

        no_plan = plain()
        for layer in eng.model.model.layers:
            layer._compiled_call_impl = None  # the reference: plain transformers, eager
        for got, want in zip(no_plan, plain(), strict=True):
            assert torch.allclose(got, want, atol=1e-5)
        for out, req, prompt in zip(outs, reqs, prompts, strict=True):
            _check(eng, out, prompt, req.sampling.max_response_len or 1, None)
        assert [o.token_ids for o in outs_again] == [o.token_ids for o in outs[:3]]
    finally:
        torch._dynamo.reset()
        await eng.shutdown()


def test_each_tree_depth_is_one_contiguous_run_cut_by_its_ancestors() -> None:
    """The layout the GPU's flash path reads without gathers: depth after depth, and at each
    depth the tokens below one shallower node contiguous, in that node's order."""
    plan = build_plan(_mixed_prompts(), torch.device("cpu"))
    assert len(plan.runs) >= 2 and plan.runs[0].start == 0
    assert plan.runs[-1].stop == plan.num_tokens
    for d, run in enumerate(plan.runs):
        assert d == 0 or run.start == plan.runs[d - 1].stop
        assert int(run.cu[-1]) == run.stop - run.start
        assert all(int(cu[-1]) == run.stop - run.start for cu in run.cu_by_ancestor)
    for node in plan.row_node:  # every row's path: each node in the piece of its ancestors
        path = []
        cur = node
        while cur is not None:
            path.append(cur)
            cur = cur.parent
        for n in path:
            run = plan.runs[n.depth - 1]  # depths count from 1
            for a in path:
                if a.depth >= n.depth:
                    continue
                up = plan.runs[a.depth - 1]
                a_index = up.cu.tolist().index(a.offset - up.start)
                cu = run.cu_by_ancestor[a.depth - 1].tolist()
                at = n.offset - run.start
                assert cu[a_index] <= at < cu[a_index + 1], (n.depth, a.depth)


def test_radix_tree_of_groups_templates_and_duplicates() -> None:
    template = list(range(100, 140))  # 40 tokens every prompt starts with
    q1, q2 = list(range(200, 230)), list(range(300, 320))
    prompts = [
        template + q1 + [1, 2, 3],
        template + q1 + [4, 5],
        template + q2 + [6],
        template + q2 + [6],  # duplicate: one node, two rows
        template + q1,  # ends where the group's answers begin
        [9, 9, 9],  # shares nothing
    ]
    forest = build_forest(prompts)
    assert [len(n.tokens) for n in forest] == [40, 3]
    top = forest[0]
    assert sorted(len(c.tokens) for c in top.children) == [21, 30]  # q1 | q2 + [6]
    q1_node = next(c for c in top.children if len(c.tokens) == 30)
    assert q1_node.ending == [4] and len(q1_node.children) == 2
    plan = build_plan(prompts, torch.device("cpu"))
    assert plan.num_tokens == 40 + 30 + 3 + 2 + 21 + 3
    assert plan.shared_tokens == sum(map(len, prompts)) - plan.num_tokens
    assert plan.last_index[2] == plan.last_index[3]
    paths, lengths = plan.row_paths(list(range(len(prompts))), torch.device("cpu"))
    ids = plan.input_ids[0]
    for row, prompt in enumerate(prompts):  # each row's path spells its prompt, positions too
        assert ids[paths[row, : lengths[row]]].tolist() == prompt
        assert plan.position_ids[0, paths[row, : lengths[row]]].tolist() == list(range(len(prompt)))


def test_short_shared_runs_are_not_nodes() -> None:
    """A run shared by several rows but shorter than the minimum is repeated per branch."""
    prompts = [[1, 2, 3, 10 + i, *range(50, 70)] for i in range(3)]
    forest = build_forest(prompts, min_shared=16)
    assert len(forest) == 3 and all(len(n.tokens) == 24 for n in forest)


def _sampling(n: int, **params: object) -> RowSampling:
    sp = SamplingParams(**params)  # type: ignore[arg-type]
    return RowSampling.of([sp] * n, list(range(n)), torch.device("cpu"))


def test_sampling_filters_and_distribution() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 12, generator=gen).repeat(4000, 1) * 2
    # T = 1: the draw follows softmax(logits) (4000 independent seeds)
    tokens, logprobs, raw = sample(logits, _sampling(4000, temperature=1.0), step=0)
    freq = torch.bincount(tokens, minlength=12).float() / 4000
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.03)
    assert torch.allclose(logprobs, raw)
    # temperature-scaled log-prob before truncation; top-k keeps the k best; top-p the nucleus
    tokens, logprobs, raw = sample(logits, _sampling(4000, temperature=0.5, top_k=3), step=1)
    assert set(tokens.tolist()) <= set(torch.topk(logits[0], 3).indices.tolist())
    assert torch.allclose(
        logprobs, torch.log_softmax(logits / 0.5, -1).gather(1, tokens[:, None])[:, 0]
    )
    probs = torch.softmax(logits[0], -1)
    order = torch.argsort(probs, descending=True)
    tokens, _, _ = sample(
        logits, _sampling(4000, temperature=1.0, top_p=float(probs[order[0]]) + 1e-3), step=2
    )
    assert set(tokens.tolist()) == set(order[:2].tolist())
    # greedy rows: the arg-max, log-prob = raw log-prob; and steps draw fresh noise
    tokens, logprobs, raw = sample(logits[:3], _sampling(3, temperature=0.0), step=0)
    assert tokens.tolist() == [int(logits[0].argmax())] * 3 and torch.equal(logprobs, raw)
    a = sample(logits, _sampling(4000, temperature=1.0), step=5)[0]
    b = sample(logits, _sampling(4000, temperature=1.0), step=6)[0]
    assert (a != b).float().mean() > 0.3


def test_chunks_cut_between_groups(engine: HFEngine) -> None:
    """Three groups of 6 with room for 8 rows: three chunks of one whole group each."""
    gen = torch.Generator().manual_seed(5)
    prompts = []
    for g in range(3):
        head = [5 + g, *_ids(gen, 40)]
        prompts += [head + _ids(gen, 5) for _ in range(6)]
    order = torch.randperm(len(prompts), generator=gen).tolist()  # arrival order is mixed
    rows = [engine._make_row(_request(prompts[i], 1)) for i in order]
    small = engine.spec.model_copy(
        update={"engine_config": engine.spec.engine_config.model_copy(update={"max_batch_size": 8})}
    )
    engine.spec, saved = small, engine.spec
    try:
        chunks = engine._chunks(rows)
    finally:
        engine.spec = saved
    assert sorted(len(c) for c in chunks) == [6, 6, 6]
    assert all(len({r.prompt[0] for r in c}) == 1 for c in chunks)


def test_the_chunk_budget_counts_shared_tokens_once(engine: HFEngine) -> None:
    """Four groups of 4 judge prompts (60 shared + 5 own tokens): 1,040 prompt tokens but 340
    for the packed prefill, so a budget of 400 holds them in one chunk. Rows that decode on
    also hold a static cache of their whole prompt + reply, so the same rows at 4 new tokens
    need more chunks, cut between groups."""
    gen = torch.Generator().manual_seed(9)
    prompts = []
    for g in range(4):
        head = [5 + g, *_ids(gen, 59)]
        prompts += [head + _ids(gen, 5) for _ in range(4)]
    assert sum(map(len, prompts)) == 1040
    saved = engine.max_batch_tokens
    engine.max_batch_tokens = 400
    try:
        verdicts = engine._chunks([engine._make_row(_request(p, 1)) for p in prompts])
        decoding = engine._chunks([engine._make_row(_request(p, 4)) for p in prompts])
    finally:
        engine.max_batch_tokens = saved
    assert [len(c) for c in verdicts] == [16]
    assert len(decoding) > 1
    for chunk in decoding:
        assert len({r.prompt[0] for r in chunk}) == 1  # a group is never split
        unique = build_plan([r.prompt for r in chunk], torch.device("cpu")).num_tokens
        assert unique + sum(len(r.prompt) + 4 for r in chunk) <= 400


def _judge_request(text: str, **sampling: object) -> EngineRequest:
    params = SamplingParams(temperature=0.0, max_response_len=1, **sampling)  # type: ignore[arg-type]
    return EngineRequest(
        sampling=params.merged_over(DEFAULT_SAMPLING),
        messages=[Message(role="user", content=text)],
    )


async def test_logprob_verdict_from_the_same_prefill(engine: HFEngine) -> None:
    off = {"enable_thinking": False}
    reqs = [
        _judge_request(
            f"Problem {i}: is 2 + {i} = {2 + i}? Reply 1 or 0.",
            logprob_verdict=True,
            chat_template_kwargs=off,
        )
        for i in range(3)
    ]
    reqs.append(_judge_request("Reply 1 or 0.", chat_template_kwargs=off))  # did not ask
    outs = await engine.generate(reqs)
    one = engine.tokenizer("1", add_special_tokens=False)["input_ids"][0]
    zero = engine.tokenizer("0", add_special_tokens=False)["input_ids"][0]
    for out, req in zip(outs[:3], reqs[:3], strict=True):
        with torch.inference_mode():
            ids = torch.tensor([engine.encode(req)])
            probs = torch.softmax(engine.model(input_ids=ids).logits[0, -1].float(), -1)
        expected = float(probs[one] / (probs[one] + probs[zero]))
        assert out.extra["verdict_prob"] == pytest.approx(expected, abs=1e-5)
        assert 0.0 < out.extra["verdict_prob"] < 1.0
    assert "verdict_prob" not in outs[3].extra


async def test_logprob_verdict_is_refused_with_thinking_on(engine: HFEngine) -> None:
    before = dict(engine.counters)
    with pytest.raises(VerdictUnavailableError, match="thinking off"):
        await engine.generate([_judge_request("Reply 1 or 0.", logprob_verdict=True)])
    assert engine.counters == before


async def test_a_refused_request_fails_alone_and_its_batch_neighbours_run(
    engine: HFEngine,
) -> None:
    # Concurrent callers share engine batches: one caller's bad value must not fail the others.
    good = [_judge_request(f"Is {i} + 1 = {i + 1}? Reply 1 or 0.") for i in range(2)]
    alone = await engine.generate(good)
    too_long = EngineRequest(sampling=good[0].sampling, prompt_token_ids=[11] * 9000)
    bad = _judge_request("Reply 1 or 0.", logprob_verdict=True)  # thinking on
    with pytest.raises(EngineBatchError) as info:
        await engine.generate([good[0], bad, too_long, good[1]])
    first, refused, over, second = info.value.results
    assert isinstance(refused, VerdictUnavailableError)
    assert isinstance(over, PromptTooLongError)
    assert isinstance(first, EngineOutput) and isinstance(second, EngineOutput)
    assert [first.token_ids, second.token_ids] == [o.token_ids for o in alone]


def _tiny_gemma3(path: Path) -> Path:
    """A random Gemma 3 text model (the embedded judge's architecture): sliding-window layers
    (window 8, far shorter than the prompts) beside full-attention ones, one KV head."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from genrm_serve.testing import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    config = Gemma3TextConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=512,
        initializer_range=0.2,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


async def test_sliding_window_layers_match_plain_transformers(tmp_path: Path) -> None:
    spec = InstanceSpec(
        route_key="judge",
        model_path=str(_tiny_gemma3(tmp_path / "gemma")),
        num_gpus=1,
        engine="hf",
        engine_config=EngineConfig(device="cpu", dtype="float32"),
    )
    gemma = HFEngine(spec, "judge/0")
    await gemma.start()
    prompts = _mixed_prompts()
    outs = await gemma.generate([_request(p, 4) for p in prompts])
    assert gemma.counters["prefix_shared_tokens"] > 0
    for out, prompt in zip(outs, prompts, strict=True):
        _check(gemma, out, prompt, 4, None)
    await gemma.shutdown()
