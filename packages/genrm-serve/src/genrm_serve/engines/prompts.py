"""Chat messages → prompt token ids, shared by every engine that tokenises on our side.

One place applies the model's chat template with the request's ``chat_template_kwargs`` (e.g.
``enable_thinking: false``), supplies a plain template to base models that have none, and refuses
a prompt longer than ``max_context_len`` before any engine sees it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from genrm_serve.engines.base import (
    EngineError,
    EngineRequest,
    PromptTooLongError,
    RequestRefusedError,
    VerdictUnavailableError,
)

__all__ = ["FALLBACK_CHAT_TEMPLATE", "PromptEncoder"]

#: For models without a chat template (base models such as the embedded Gemma 3 270M): the
#: system text, then "User: ..." / "Assistant: ..." turns separated by blank lines, ending with
#: "Assistant:" so that the model continues as the assistant.
FALLBACK_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n\n"
    "{% else %}Assistant: {{ m['content'] }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


class PromptEncoder:
    """A tokenizer plus the context limit of one instance."""

    def __init__(self, tokenizer: Any, max_context_len: int) -> None:
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self.max_context_len = max_context_len

    @classmethod
    def load(cls, model_dir: str | Path, max_context_len: int) -> PromptEncoder:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(model_dir), max_context_len)

    def render(self, request: EngineRequest) -> str:
        """The prompt text of a chat request."""
        if not request.messages:
            raise EngineError("request has neither messages nor prompt_token_ids")
        kwargs = request.sampling.chat_template_kwargs or {}
        text = self.tokenizer.apply_chat_template(
            [m.model_dump() for m in request.messages],
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        return str(text)

    def encode(self, request: EngineRequest) -> list[int]:
        """The prompt's token ids (no length check)."""
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        ids: list[int] = self.tokenizer(self.render(request), add_special_tokens=False)["input_ids"]
        return ids

    def checked(self, request: EngineRequest) -> list[int]:
        """:meth:`encode`, raising :class:`PromptTooLongError` past ``max_context_len``."""
        return self._check(self.encode(request))

    def checked_many(self, requests: list[EngineRequest]) -> list[list[int] | RequestRefusedError]:
        """:meth:`checked` of each request, a refused one's error as its entry. The chat prompts
        go through the tokenizer in one call, which a fast tokenizer spreads over its threads:
        a judge batch of 64 prompts of ~1,000 tokens took 66 ms one by one and 43 ms as one call
        on 2 cores, and the GPU waits for it."""
        chats = [i for i, r in enumerate(requests) if r.prompt_token_ids is None]
        texts = [self.render(requests[i]) for i in chats]
        encoded: dict[int, list[int]] = {}
        if texts:
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            encoded = dict(zip(chats, ids, strict=True))
        out: list[list[int] | RequestRefusedError] = []
        for i, request in enumerate(requests):
            tokens = encoded.get(i)
            if tokens is None:
                tokens = list(request.prompt_token_ids or [])
            try:
                out.append(self._check(tokens))
            except RequestRefusedError as err:
                out.append(err)
        return out

    def _check(self, ids: list[int]) -> list[int]:
        if len(ids) > self.max_context_len:
            raise PromptTooLongError(len(ids), self.max_context_len)
        if not ids:
            raise EngineError("empty prompt")
        return list(ids)

    def max_new_tokens(self, request: EngineRequest, prompt_len: int, default: int) -> int:
        """``max_response_len``, cut so that prompt + response fit in ``max_context_len``."""
        limit = request.sampling.max_response_len or default
        return max(0, min(limit, self.max_context_len - prompt_len))

    def verdict_tokens(self, request: EngineRequest) -> tuple[int, int]:
        """The token ids of "1" and "0" for ``sampling.logprob_verdict``, or its refusal: the
        verdict is P("1") / (P("1") + P("0")) at the first reply token, which means nothing with
        thinking on or where a digit is not one token."""
        kwargs = request.sampling.chat_template_kwargs or {}
        template = str(getattr(self.tokenizer, "chat_template", "") or "")
        thinking = request.messages is not None and "enable_thinking" in template
        if thinking and kwargs.get("enable_thinking", True):
            raise VerdictUnavailableError(
                "sampling_params.logprob_verdict needs thinking off: with thinking on the "
                "first reply token is a thought, not a verdict; send "
                "chat_template_kwargs={'enable_thinking': false}"
            )
        ids = []
        for digit in ("1", "0"):
            encoded = self.tokenizer(digit, add_special_tokens=False)["input_ids"]
            if len(encoded) != 1:
                raise VerdictUnavailableError(
                    f"sampling_params.logprob_verdict: {digit!r} is not a single token of this "
                    f"judge's tokenizer (it encodes as {encoded})"
                )
            ids.append(int(encoded[0]))
        return ids[0], ids[1]
