"""The OpenAI-compatible chat endpoint's wire format (``POST /genrm/v1/chat/completions``).

``model`` is the route_key, so any OpenAI SDK pointed at ``<url>/genrm/v1`` can call a judge.
Only the parameters a judge can honour are accepted; anything else (``n`` > 1, streaming, tools,
an unknown key) is refused with 422 naming it, rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from genrm_client.types import Message, SamplingParams
from genrm_serve.engines.base import EngineOutput

__all__ = ["ChatCompletionRequest", "chat_completion_response", "models_response"]


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_ContentPart]
    name: str | None = None

    def to_message(self) -> Message:
        text = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        )
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=text)


class ChatCompletionRequest(BaseModel):
    """The subset of OpenAI's chat-completions request a judge honours."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, description="the route_key of the judge instance")
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: Literal[1] | None = None
    stream: Literal[False] | None = None
    user: str | None = None
    #: Extensions (as in vLLM / SGLang's OpenAI servers).
    top_k: int | None = Field(default=None, ge=-1)
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        return [v] if isinstance(v, str) else v

    def sampling_params(self) -> SamplingParams:
        stop = self.stop if isinstance(self.stop, list) or self.stop is None else [self.stop]
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_response_len=self.max_completion_tokens or self.max_tokens,
            stop=stop,
            seed=self.seed,
            chat_template_kwargs=self.chat_template_kwargs,
        )

    def chat_messages(self) -> list[Message]:
        return [m.to_message() for m in self.messages]


def chat_completion_response(model: str, out: EngineOutput) -> dict[str, Any]:
    finish = out.finish_reason if out.finish_reason in ("stop", "length") else "stop"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": out.text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
        },
    }


def models_response(route_keys: list[str], created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": key, "object": "model", "created": created, "owned_by": "genrm"}
            for key in route_keys
        ],
    }
