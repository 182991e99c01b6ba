"""Rollout: n samples per prompt from the rollout engines, each handed on as soon as it is done.

Prompts are tokenised here, with the policy's tokenizer, and sent as token ids: the trainer then
scores exactly the tokens the engine conditioned on. Groups go to the engines concurrently (round
robin), and every finished group's samples are passed to ``on_done`` at once — that is how inline
rewards overlap the rest of the rollout. Stop strings are applied to the sampled tokens here too
(cut after the first token whose text completes a stop string), so the response text, its tokens
and their log-probs always agree whatever the engine does with ``stop``.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from genrm_client.types import SamplingParams
from genrm_serve import EngineOutput, EngineRequest
from rl_core.data import PromptRecord
from rl_core.engines import EngineHandle
from rl_core.sample import Sample


class RolloutError(RuntimeError):
    """The rollout engines returned something the trainer cannot use."""


@dataclass(frozen=True)
class RolloutSettings:
    n_samples_per_prompt: int
    max_response_len: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    apply_chat_template: bool = False
    max_prompt_len: int | None = None
    need_logprobs: bool = True
    seed: int | None = None
    #: ``--keep-cut-off``: a response cut off at the length limit stays in the loss
    keep_cut_off: bool = False


def encode_prompt(tokenizer: Any, prompt: str | list[dict[str, str]], chat: bool) -> list[int]:
    """Token ids of a prompt: the chat template when asked (and a chat prompt), else plain text."""
    if isinstance(prompt, list):
        if chat:
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        prompt = "\n\n".join(m["content"] for m in prompt)
    return [int(t) for t in tokenizer(prompt, add_special_tokens=True)["input_ids"]]


def apply_stop(tokenizer: Any, tokens: list[int], stop: Sequence[str]) -> tuple[int, str | None]:
    """How many tokens to keep so the response ends with its first stop string (or all)."""
    if not stop:
        return len(tokens), None
    for i in range(len(tokens)):
        text = tokenizer.decode(tokens[: i + 1], skip_special_tokens=True)
        for s in stop:
            if s in text:
                return i + 1, s
    return len(tokens), None


#: Seed namespaces: training rollouts and evaluations never draw the same seed.
SEED_TRAIN, SEED_EVAL = 0, 1


def sample_seed(base: int, kind: int, step: int, group: int, index: int) -> int:
    """A sampling seed per (run seed, train/eval, step, group, sample), collision-free in
    practice for any batch size (a hash, not ``step * 100_000 + group * 1000 + index``)."""
    key = struct.pack("<5q", base, kind, step, group, index)
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") & 0x7FFFFFFF


def make_group(record: PromptRecord, group_id: int, n: int) -> list[Sample]:
    return [
        Sample(
            prompt=record.prompt,
            label=record.label,
            metadata=dict(record.metadata),
            group_id=group_id,
            index=i,
        )
        for i in range(n)
    ]


def fill_sample(
    sample: Sample, out: EngineOutput, tokenizer: Any, settings: RolloutSettings
) -> None:
    """Copy one engine output into its sample, applying stop strings to tokens and log-probs."""
    if out.token_ids is None:
        raise RolloutError("the rollout engine returned no token ids (return_tokens=True)")
    tokens = list(out.token_ids)
    logprobs = list(out.logprobs) if out.logprobs is not None else None
    if settings.need_logprobs and (logprobs is None or len(logprobs) != len(tokens)):
        raise RolloutError(
            f"the rollout engine returned {0 if logprobs is None else len(logprobs)} log-probs "
            f"for {len(tokens)} tokens; TIS and the trainer need one per sampled token"
        )
    keep, hit = apply_stop(tokenizer, tokens, settings.stop)
    finish = out.finish_reason
    if hit is not None:
        tokens = tokens[:keep]
        logprobs = logprobs[:keep] if logprobs is not None else None
        finish = "stop"
    sample.response_tokens = tokens
    sample.rollout_logprobs = logprobs or []
    sample.response = tokenizer.decode(tokens, skip_special_tokens=True)
    sample.finish_reason = finish
    sample.weight_version = out.weight_version
    sample.keep_cut_off = settings.keep_cut_off
    if finish in ("abort", "error"):  # cut off by the engine: never judged, never trained
        sample.status = "aborted"


async def generate_groups(
    engines: Sequence[EngineHandle],
    groups: list[list[Sample]],
    tokenizer: Any,
    settings: RolloutSettings,
    on_done: Callable[[list[Sample]], Awaitable[None] | None] | None = None,
    *,
    seed_key: tuple[int, int] = (0, 0),
) -> list[list[Sample]]:
    """Generate every group (one engine call per group, round robin over ``engines``).

    ``on_done(group)`` runs as each group completes (before the others finish). A prompt over
    ``max_prompt_len`` is an error naming its length and the limit.
    """
    if not engines:
        raise RolloutError("no rollout engine")

    async def one(gi: int, group: list[Sample]) -> list[Sample]:
        head = group[0]
        ids = encode_prompt(tokenizer, head.prompt, settings.apply_chat_template)
        if settings.max_prompt_len is not None and len(ids) > settings.max_prompt_len:
            raise RolloutError(
                f"prompt of group {head.group_id} has {len(ids)} tokens, more than "
                f"--rollout-max-prompt-len {settings.max_prompt_len}"
            )
        requests = []
        for s in group:
            s.prompt_tokens = ids
            seed = (
                None
                if settings.seed is None
                else sample_seed(settings.seed, *seed_key, s.group_id, s.index)
            )
            requests.append(
                EngineRequest(
                    sampling=SamplingParams(
                        temperature=settings.temperature,
                        top_p=settings.top_p,
                        top_k=settings.top_k,
                        max_response_len=settings.max_response_len,
                        stop=list(settings.stop) or None,
                        seed=seed,
                    ),
                    prompt_token_ids=ids,
                    return_tokens=True,
                    request_id=f"g{s.group_id}-s{s.index}",
                )
            )
        outputs = await engines[gi % len(engines)].generate_many(requests)
        if len(outputs) != len(requests):
            raise RolloutError(f"engine returned {len(outputs)} outputs for {len(requests)}")
        for s, out in zip(group, outputs, strict=True):
            fill_sample(s, out, tokenizer, settings)
        if on_done is not None:
            maybe = on_done(group)
            if maybe is not None:
                await maybe
        return group

    return list(await asyncio.gather(*(one(i, g) for i, g in enumerate(groups))))
