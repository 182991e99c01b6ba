"""Which prompt runs the SGLang engine computes ahead, and which requests wait for them.

Why warm up: SGLang prefills requests that arrive together side by side, none of them in its
radix cache yet, so a GRPO group's judge prompts sent together would each recompute the group's
question and reference; a run enters the radix cache when its request finishes. So each run that
prompts of a batch share (:func:`shared_prefixes`) is sent alone first, one new token, and its
members (:func:`run_of_each`) go out as soon as *that* warm-up has finished (not after every
group's); :attr:`WarmupPolicy.wave_tokens` can split the warm-ups into waves (:func:`warm_waves`).
A prompt that starts with no shared run, or that is not :func:`prefill_bound`, is submitted at
once. :func:`plan_warmups` is the whole decision for one batch.

Why follow: samples of a GRPO group reach a judge one by one as their rollouts finish (inline
scoring), each a batch of one. A run enters SGLang's radix cache only once the request computing
it is prefilled, so a sample arriving meanwhile would compute the whole question and reference
again (on the H200, 256 samples arriving within a second took 7,840 of 128,000 prompt tokens from
the cache). So a request of a group (its ``prefix_key``) whose run another request of the group is
computing right now waits for that one (:func:`follow_or_lead`), at most
``limits.SGLANG_FOLLOW_WAIT_S``.

Pure functions of token ids and sizes: the engine (``engine.py``) does the sending and waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from genrm_serve.engines.prefix_tree import build_forest, common_prefix_len

__all__ = [
    "PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN",
    "PREFIX_WARM_MIN_TOKENS",
    "PREFIX_WARM_WAVE_TOKENS",
    "FollowAction",
    "WarmupPlan",
    "WarmupPolicy",
    "follow_or_lead",
    "plan_warmups",
    "prefill_bound",
    "run_of_each",
    "shared_prefixes",
    "warm_waves",
]

#: A run shared by prompts of one batch shorter than this is not computed ahead: a round trip
#: costs more than recomputing it (a GRPO group's question + reference runs hundreds of tokens).
PREFIX_WARM_MIN_TOKENS = 64
#: The shared runs of one wave of warm-ups, in tokens (``None`` or 0: every run in one wave).
#: In waves, the next one goes out when the previous one's warm-ups have finished, beside the
#: earlier groups' members. Off: on the H200 (Qwen3-4B shape, ``benchmarks/judge_engines.py``)
#: one wave of all made 245 / 376 judgments/s where waves of 2,048 tokens made 178 / 234; a
#: later wave waits for the earlier one's round trip, and SGLang prefills the first wave fast.
PREFIX_WARM_WAVE_TOKENS: int | None = None
#: Only a prefill-bound request is warmed up: one that generates at most this many tokens per
#: prompt token (a judge's verdict over a question and a reference). A rollout's samples share
#: their whole prompt too, but their decode dwarfs it, and a warm-up holds every member's first
#: token back by a round trip. ``None``: warm up whatever the request generates.
PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN: float | None = 1.0


@dataclass(frozen=True)
class WarmupPolicy:
    """The engine's warm-up settings (the module's constants by default; benchmarks vary them)."""

    min_tokens: int = PREFIX_WARM_MIN_TOKENS
    wave_tokens: int | None = PREFIX_WARM_WAVE_TOKENS
    max_new_per_prompt_token: float | None = PREFIX_WARM_MAX_NEW_PER_PROMPT_TOKEN


@dataclass(frozen=True)
class WarmupPlan:
    """What to send for one batch, and in which order.

    ``at_once``: the requests (batch indices, in batch order) sent straight away.
    ``runs``: the shared runs to warm up; ``members[r]``: the requests (batch order) that go out
    once run ``r``'s warm-up has finished; ``waves``: the runs' indices, wave by wave.
    """

    at_once: list[int] = field(default_factory=list)
    runs: list[list[int]] = field(default_factory=list)
    members: list[list[int]] = field(default_factory=list)
    waves: list[list[int]] = field(default_factory=list)


def shared_prefixes(prompts: Sequence[Sequence[int]], min_tokens: int) -> list[list[int]]:
    """The leading runs of at least ``min_tokens`` that two or more of ``prompts`` share (the
    roots of their radix tree), each once."""
    if len(prompts) < 2:
        return []
    return [
        node.tokens
        for node in build_forest([list(p) for p in prompts], min_shared=min_tokens)
        if len(node.tokens) >= min_tokens and len(node.ending) + len(node.children) > 1
    ]


def run_of_each(
    prompts: Sequence[Sequence[int]], runs: Sequence[Sequence[int]]
) -> list[int | None]:
    """For each prompt, the index in ``runs`` of the longest run that is its prefix (``None``:
    none is). The runs of :func:`shared_prefixes` are the roots of a radix tree, so a prompt
    starts with at most one of them; taking the longest keeps a prompt with its closest group
    should runs ever nest (its members wait for the run that gives them the most)."""
    owners: list[int | None] = []
    for prompt in prompts:
        best: int | None = None
        for r, run in enumerate(runs):
            longer = best is None or len(run) > len(runs[best])
            if longer and len(run) <= len(prompt) and list(prompt[: len(run)]) == list(run):
                best = r
        owners.append(best)
    return owners


def prefill_bound(prompt_tokens: int, max_new_tokens: int, policy: WarmupPolicy) -> bool:
    """Whether computing the prompt is most of a request's work
    (:attr:`WarmupPolicy.max_new_per_prompt_token`)."""
    ratio = policy.max_new_per_prompt_token
    return ratio is None or max_new_tokens <= ratio * prompt_tokens


def warm_waves(runs: Sequence[Sequence[int]], wave_tokens: int | None) -> list[list[int]]:
    """``runs``' indices in waves of at most ``wave_tokens`` tokens of runs, in order (a run
    longer than that is a wave of its own); ``None`` or 0: one wave of all."""
    if not wave_tokens:
        return [list(range(len(runs)))] if runs else []
    waves: list[list[int]] = []
    size = 0
    for r, run in enumerate(runs):
        if not waves or size + len(run) > wave_tokens:
            waves.append([])
            size = 0
        waves[-1].append(r)
        size += len(run)
    return waves


def plan_warmups(
    prompts: Mapping[int, Sequence[int]],
    max_new_tokens: Mapping[int, int],
    policy: WarmupPolicy,
) -> WarmupPlan:
    """The warm-ups of one batch: ``prompts`` (batch index → prompt ids, in batch order) and
    each one's ``max_new_tokens``. Only prefill-bound prompts share runs; the others, and those
    that start with no shared run, go out at once."""
    bound = [i for i, ids in prompts.items() if prefill_bound(len(ids), max_new_tokens[i], policy)]
    bound_prompts = [prompts[i] for i in bound]
    runs = shared_prefixes(bound_prompts, policy.min_tokens)
    owner = dict(zip(bound, run_of_each(bound_prompts, runs), strict=True))
    members: list[list[int]] = [[] for _ in runs]
    at_once: list[int] = []
    for i in prompts:  # in the batch's order
        r = owner.get(i)
        if r is None:
            at_once.append(i)
        else:
            members[r].append(i)
    return WarmupPlan(at_once, runs, members, warm_waves(runs, policy.wave_tokens))


#: ``follow``: wait for the group's request computing the shared run; ``lead``: go out, and
#: later requests of the group follow this one; ``alone``: go out, nobody follows.
FollowAction = Literal["follow", "lead", "alone"]


def follow_or_lead(
    prompt: Sequence[int], leader: Sequence[int] | None, policy: WarmupPolicy
) -> FollowAction:
    """What a request that shares no run with its own batch does, given ``leader``: the prompt
    of the request of its group computing the group's run right now (``None``: none is, or the
    request has no group). It follows when the two share at least ``policy.min_tokens``; a
    prompt that long leads its group's later requests."""
    if leader is not None and common_prefix_len(list(leader), list(prompt)) >= policy.min_tokens:
        return "follow"
    return "lead" if len(prompt) >= policy.min_tokens else "alone"
