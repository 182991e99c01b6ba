"""Reading the question, the reference and the response out of any ``SampleLike``.

The original reads ``metadata["question"]`` and ``metadata["label"]``; datasets in the slime /
verl shape carry the reference as ``sample.label`` and the question only inside the prompt, so
both fall back. A sample without a reference cannot be judged: that is a data error, raised
with the key that was missing, not a silent empty string in the judge prompt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genrm_rewards.errors import RewardInputError
from genrm_rewards.types import SampleLike

__all__ = ["extract_answer", "label_of", "question_of", "response_of"]

#: Without an ``Answer:`` line, the judged answer is the response's tail of this length.
ANSWER_TAIL_CHARS = 300


def extract_answer(response: str) -> str:
    """The text after the last ``Answer:``; without one, the last 300 characters."""
    if "Answer:" in response:
        return response.rsplit("Answer:", 1)[1]
    return response[-ANSWER_TAIL_CHARS:]


def _prompt_user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list | tuple):
        for message in reversed(prompt):
            if isinstance(message, Mapping) and message.get("role") == "user":
                return str(message.get("content", ""))
    return ""


def question_of(sample: SampleLike) -> str:
    """``metadata["question"]``, else the last user message of the prompt (or the prompt text)."""
    question = (sample.metadata or {}).get("question")
    if question is None or question == "":
        question = _prompt_user_text(sample.prompt)
    if not str(question).strip():
        raise RewardInputError(
            "sample has no question: metadata['question'] is missing and the prompt has no user "
            "text (the judge needs the question)"
        )
    return str(question)


def label_of(sample: SampleLike) -> str:
    """``metadata["label"]``, else ``sample.label``, as text."""
    label = (sample.metadata or {}).get("label")
    if label is None or label == "":
        label = sample.label
    if label is None or str(label).strip() == "":
        raise RewardInputError(
            f"sample has no reference answer: metadata['label'] and sample.label are both "
            f"empty (got {label!r}); a judge cannot compare against nothing"
        )
    return str(label)


def response_of(sample: SampleLike) -> str:
    """The policy's response text (``None`` → ``""``: an empty answer is judged, not skipped)."""
    response = sample.response
    if response is None:
        return ""
    if not isinstance(response, str):
        raise RewardInputError(
            f"sample.response must be text, got {type(response).__name__}: {response!r:.80}"
        )
    return response
