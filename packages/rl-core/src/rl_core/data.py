"""Prompt data: jsonl training / evaluation sets, and the CPU demo's self-generated math set.

A record is ``{"<input-key>": str | [{"role", "content"}, ...], "<label-key>": str | number,
"metadata": {...}?}`` (dapo-math-17k, AIME-2024). The question text and the label are copied into
``metadata`` because that is where the dapo-genrm reward looks for them. A bad record is reported
with its line number and the rule it broke: skipped and counted by default, fatal under
``--strict-data`` — a data set that silently shrinks is how a run trains on something else than
its author thinks.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Prompt = str | list[dict[str, str]]

_ROLES = {"system", "user", "assistant", "tool"}


class DataError(ValueError):
    """A record (or a whole file) that cannot be used; the message names file, line and rule."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt with its reference answer."""

    prompt: Prompt
    label: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BadRecord:
    line: int
    reason: str


@dataclass(frozen=True)
class PromptDataset:
    """The usable records of a file, and the ones that were skipped (with why)."""

    source: str
    records: list[PromptRecord]
    skipped: list[BadRecord]

    def __len__(self) -> int:
        return len(self.records)


def question_text(prompt: Prompt) -> str:
    """The question a judge should see: the last user message, or the prompt string itself."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(prompt):
        if message["role"] == "user":
            return message["content"]
    return prompt[-1]["content"]


def _check_prompt(value: Any, input_key: str) -> Prompt:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{input_key!r} is an empty string")
        return value
    if isinstance(value, list):
        if not value:
            raise DataError(f"{input_key!r} is an empty message list")
        messages = []
        for i, message in enumerate(value):
            if not isinstance(message, dict):
                raise DataError(
                    f"{input_key!r}[{i}] must be an object, got {type(message).__name__}"
                )
            role, content = message.get("role"), message.get("content")
            if role not in _ROLES:
                raise DataError(
                    f"{input_key!r}[{i}].role must be one of {sorted(_ROLES)}, got {role!r}"
                )
            if not isinstance(content, str):
                raise DataError(f"{input_key!r}[{i}].content must be a string, got {content!r}")
            messages.append({"role": role, "content": content})
        return messages
    raise DataError(
        f"{input_key!r} must be a string or a list of chat messages, got {type(value).__name__}"
    )


def parse_record(obj: Any, *, input_key: str, label_key: str | None) -> PromptRecord:
    """Turn one decoded json object into a record, or raise DataError naming the rule."""
    if not isinstance(obj, dict):
        raise DataError(f"record must be a json object, got {type(obj).__name__}")
    if input_key not in obj:
        raise DataError(f"missing key {input_key!r} (--input-key); keys are {sorted(obj)}")
    prompt = _check_prompt(obj[input_key], input_key)
    label: str | None = None
    if label_key is not None:
        if label_key not in obj:
            raise DataError(f"missing key {label_key!r} (--label-key); keys are {sorted(obj)}")
        raw = obj[label_key]
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise DataError(f"{label_key!r} must be a string or a number, got {raw!r}")
        label = str(raw)
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DataError(f"'metadata' must be an object, got {type(metadata).__name__}")
    metadata = dict(metadata)
    metadata.setdefault("question", question_text(prompt))
    if label is not None:
        metadata["label"] = label
    return PromptRecord(prompt=prompt, label=label, metadata=metadata)


def load_prompt_data(
    path: str | Path,
    *,
    input_key: str = "prompt",
    label_key: str | None = "label",
    strict: bool = False,
    limit: int | None = None,
) -> PromptDataset:
    """Load a jsonl prompt file (training or AIME-format evaluation set).

    Args:
        path: the jsonl file.
        input_key: the key holding the prompt (``--input-key``).
        label_key: the key holding the reference answer (``--label-key``); None for no label.
        strict: raise on the first bad record instead of skipping it (``--strict-data``).
        limit: stop after this many good records.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"prompt data {str(path)!r} is a folder; give the jsonl file in it")
    if not path.is_file():
        raise DataError(f"prompt data file {str(path)!r} does not exist")
    records: list[PromptRecord] = []
    skipped: list[BadRecord] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"invalid json: {err.msg} at column {err.colno}") from err
                records.append(parse_record(obj, input_key=input_key, label_key=label_key))
            except DataError as err:
                if strict:
                    raise DataError(f"{path}:{lineno}: {err} (--strict-data)") from err
                skipped.append(BadRecord(lineno, str(err)))
            if limit is not None and len(records) >= limit:
                break
    if not records:
        detail = f"; first problem: line {skipped[0].line}: {skipped[0].reason}" if skipped else ""
        raise DataError(f"{path}: no usable records{detail}")
    return PromptDataset(source=str(path), records=records, skipped=skipped)


@dataclass
class PromptCursor:
    """Where the run is in its data: epoch and offset into that epoch's seeded permutation.

    Saved in checkpoints so a resumed run continues with the next prompts, not the first ones.
    """

    size: int
    seed: int
    epoch: int = 0
    offset: int = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, n: int) -> list[int]:
        """The indices of the next ``n`` prompts, wrapping into a new epoch when needed."""
        out: list[int] = []
        while len(out) < n:
            order = self._order(self.epoch)
            chunk = order[self.offset : self.offset + (n - len(out))]
            out.extend(chunk)
            self.offset += len(chunk)
            if self.offset >= self.size:
                self.epoch += 1
                self.offset = 0
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "size": self.size, "seed": self.seed}

    def restore(self, state: dict[str, int]) -> None:
        if state["size"] != self.size or state["seed"] != self.seed:
            raise DataError(
                f"checkpoint data position is for {state['size']} prompts with seed "
                f"{state['seed']}, but this run has {self.size} prompts with seed {self.seed}"
            )
        self.epoch, self.offset = state["epoch"], state["offset"]


# --- the CPU demo's math set ---------------------------------------------------------------------


def _easy_problem(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    if rng.random() < 0.8:
        return f"{a} + {b}", a + b
    a, b = max(a, b), min(a, b)
    return f"{a} - {b}", a - b


def make_easy_math(n: int, *, seed: int, shots: int = 4) -> list[PromptRecord]:
    """A few-shot arithmetic set that a small *base* model partly solves, so rewards vary.

    Each prompt is ``shots`` solved one-digit equations, one per line (``"3 + 4 = 7"``), then
    one more left open (``"5 + 2 ="``); the expected completion is " 7" and a newline. Bare
    equations, not "Question: … Answer:" prose: the embedded Gemma 3 270M base model gets about
    70 % of these right at temperature 1, with right and wrong answers inside most groups of 4,
    while on the prose format it mostly answered " 2", " 4", " 6". Deterministic in ``seed``.
    The judge sees the question as ``"What is 5 + 2?"`` (``metadata["question"]``), not the
    examples.
    """
    rng = random.Random(seed)
    records = []
    for i in range(n):
        lines = []
        for _ in range(shots):
            expr, value = _easy_problem(rng)
            lines.append(f"{expr} = {value}\n")
        expr, value = _easy_problem(rng)
        prompt = "".join(lines) + f"{expr} ="
        records.append(
            PromptRecord(
                prompt=prompt,
                label=str(value),
                metadata={
                    "question": f"What is {expr}?",
                    "label": str(value),
                    "id": f"easy-math-{seed}-{i}",
                },
            )
        )
    return records


def record_json(record: PromptRecord) -> dict[str, Any]:
    """A record as a line of a prompt file (how the demo's generated sets are written)."""
    return {"prompt": record.prompt, "label": record.label, "metadata": record.metadata}


def write_prompt_data(path: Path, records: Iterable[PromptRecord]) -> Path:
    """``records`` as a prompt file (one :func:`record_json` line each); returns ``path``."""
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(record_json(r)) + "\n")
    return path
