"""A deterministic *test engine*: replies from rules, with injectable failures and delays.

It exists so that the service, the router and rl-core can be tested end to end over real Ray and
real HTTP with answers known in advance — without pretending to be a model. Every output says
which instance and engine produced it (``extra["route_key"]`` / ``extra["engine_id"]``), so a
test can prove where a request was routed.

``model_path`` forms:

* ``scripted`` — always reply ``"1"``;
* ``scripted:<default reply>`` — always reply that text;
* ``scripted:{...}`` — an inline JSON script (below);
* a path to a ``.json`` file holding the script.

The script (all keys optional)::

    {
      "default": "1",                       # reply when no rule matches
      "replies": {"substring": "reply"},    # first key found in the last user message wins
      "delay_s": 0.0,                       # asyncio sleep per batch (never blocks the loop)
      "start_delay_s": 0.0,                 # asyncio sleep in start(), as a model load takes
      "fail_every": 0,                      # k > 0: every k-th generate call raises EngineError
      "fail_when_contains": null,           # a request whose last user message has it fails
      "prefer": [],                         # a pairwise judge: words, best first (below)
      "first_bias": 0,                      # ranks Response A gains for being read first
      "crash_once_file": null,              # a path: the first generate call of any engine of
                                            # this script creates it and kills its process (once:
                                            # the re-created engine finds the file and serves)
      "healthy": true                       # false: check_health raises
    }

Replies may contain ``{route_key}``, ``{engine_id}`` and ``{last_user}``, replaced verbatim.

``prefer`` makes a pairwise judge with known preferences (pairwise-genrm's comparison prompt,
Response A and Response B quoted between ``<<<BEGIN RESPONSE A>>>`` / ``<<<END RESPONSE A>>>``
markers): each response ranks by the best word of the list it contains (one with none ranks
last), and the reply is ``"1"`` (A better) when A's rank, improved by ``first_bias`` ranks, is at
least B's, else ``"0"`` — ties go to A. ``first_bias`` > 0 is a judge that favours whatever it
reads first. A matching ``replies`` rule still wins; a prompt without the two blocks gets the
default.
"Tokens" are whitespace-separated words: ``max_context_len`` and ``max_response_len`` apply to
them, so prompt-too-long and truncation paths can be exercised without a tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import os
import zlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genrm_serve.config import InstanceSpec, invalid_json
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineError,
    EngineOutput,
    EngineRequest,
    PromptTooLongError,
)

__all__ = ["SCRIPTED_PREFIX", "Script", "ScriptedEngine", "load_script", "scripted_model_path"]

SCRIPTED_PREFIX = "scripted"


class Script(BaseModel):
    """The rules a :class:`ScriptedEngine` answers by."""

    model_config = ConfigDict(extra="forbid")

    default: str = "1"
    replies: dict[str, str] = Field(default_factory=dict)
    delay_s: float = Field(default=0.0, ge=0.0)
    start_delay_s: float = Field(default=0.0, ge=0.0)
    fail_every: int = Field(default=0, ge=0)
    fail_when_contains: str | None = None
    prefer: list[str] = Field(default_factory=list)
    first_bias: int = Field(default=0, ge=0)
    crash_once_file: str | None = None
    healthy: bool = True


def scripted_model_path(**script: Any) -> str:
    """The inline ``model_path`` of a scripted engine that answers by ``script`` (the keys of
    :class:`Script`): what a test or an example puts in an instance's spec. A key the script
    does not know, or a value it refuses, fails here, where the test wrote it, not in the engine
    a service starts later (pydantic's ValidationError, a ValueError)."""
    return f"{SCRIPTED_PREFIX}:{Script.model_validate(script).model_dump_json(exclude_unset=True)}"


def load_script(model_path: str) -> Script:
    """Parse a scripted engine's ``model_path`` (see the module docstring for the forms)."""
    raw: Any
    if model_path == SCRIPTED_PREFIX:
        return Script()
    if model_path.startswith(SCRIPTED_PREFIX + ":"):
        rest = model_path[len(SCRIPTED_PREFIX) + 1 :]
        if not rest.lstrip().startswith("{"):
            return Script(default=rest)
        where = "inline script"
        text = rest
    else:
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise EngineError(
                f"scripted engine: model_path={model_path!r} is neither 'scripted[:reply]', "
                "'scripted:{json}' nor an existing JSON script file"
            )
        where = str(path)
        text = path.read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise EngineError(f"scripted engine: {where}: {invalid_json(err)}") from None
    try:
        return Script.model_validate(raw)
    except ValidationError as err:
        raise EngineError(f"scripted engine: {where}: {err}") from None


def _last_user(request: EngineRequest) -> str:
    for message in reversed(request.messages or []):
        if message.role == "user":
            return message.content
    return ""


def _words(text: str) -> list[str]:
    return text.split()


def _block(text: str, tag: str) -> str | None:
    start, end = f"<<<BEGIN {tag}>>>", f"<<<END {tag}>>>"
    if start not in text or end not in text:
        return None
    return text.split(start, 1)[1].split(end, 1)[0]


def _preferred(text: str, prefer: list[str], first_bias: int) -> str | None:
    """A pairwise verdict by ``prefer`` (see the module docstring); None without both blocks."""
    a, b = _block(text, "RESPONSE A"), _block(text, "RESPONSE B")
    if a is None or b is None:
        return None

    def rank(block: str) -> int:
        return next((i for i, word in enumerate(prefer) if word in block), len(prefer))

    return "1" if rank(a) - first_bias <= rank(b) else "0"


class ScriptedEngine(Engine):
    """A test engine: deterministic replies from a :class:`Script`; see the module docstring."""

    #: Methods a test may call through ``EngineWorker.control`` (failure injection).
    CONTROL_METHODS = ("set_failing", "set_delay", "set_healthy", "set_fail_every", "crash")

    def __init__(self, spec: InstanceSpec, engine_id: str) -> None:
        super().__init__(spec, engine_id)
        self.script = load_script(spec.model_path)
        self.calls = 0
        self.failing: str | None = None
        self.weights_seen: list[str] = []

    # -- failure injection -------------------------------------------------------------------
    def set_failing(self, flag: bool, message: str = "injected failure") -> None:
        """While set, every generate call raises :class:`EngineError` with ``message``."""
        self.failing = message if flag else None

    def set_delay(self, delay_s: float) -> None:
        self.script = self.script.model_copy(update={"delay_s": float(delay_s)})

    def set_healthy(self, healthy: bool) -> None:
        self.script = self.script.model_copy(update={"healthy": bool(healthy)})

    def set_fail_every(self, k: int) -> None:
        self.script = self.script.model_copy(update={"fail_every": int(k)})

    def crash(self, exit_code: int = 1) -> None:
        """Kill the engine's process at once, as a segfaulting engine would."""
        os._exit(exit_code)

    # -- Engine ------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.script.start_delay_s:
            await asyncio.sleep(self.script.start_delay_s)
        self.state = "awake"

    async def sleep(self) -> None:
        if self.state == "awake":
            self.state = "asleep"

    async def wake(self) -> None:
        if self.state == "asleep":
            self.state = "awake"

    async def check_health(self) -> None:
        await super().check_health()
        if not self.script.healthy:
            raise EngineError(f"engine {self.engine_id}: scripted unhealthy")

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        if version <= self.weight_version:
            raise EngineError(
                f"engine {self.engine_id}: weight version {version} must be greater than "
                f"{self.weight_version}"
            )
        self.weights_seen = sorted(state_dict)
        self.weight_version = version

    def prompt_tokens(self, request: EngineRequest) -> int:
        if request.prompt_token_ids is not None:
            return len(request.prompt_token_ids)
        return sum(len(_words(m.content)) for m in request.messages or [])

    def _reply(self, request: EngineRequest) -> str:
        last = _last_user(request)
        reply = self.script.default
        matched = False
        for key, value in self.script.replies.items():
            if key in last:
                reply, matched = value, True
                break
        if not matched and self.script.prefer:
            reply = _preferred(last, self.script.prefer, self.script.first_bias) or reply
        return (
            reply.replace("{route_key}", self.spec.route_key)
            .replace("{engine_id}", self.engine_id)
            .replace("{last_user}", last)
        )

    def _one(self, request: EngineRequest, n_prompt: int, batch_size: int) -> EngineOutput:
        sampling = request.sampling
        text = self._reply(request)
        finish: Any = "stop"
        cut = min((i for s in sampling.stop or [] if (i := text.find(s)) >= 0), default=None)
        if cut is not None:
            text = text[:cut]
        words = _words(text)
        limit = sampling.max_response_len
        if limit is not None and len(words) > limit:
            words = words[:limit]
            text = " ".join(words)
            finish = "length"
        out = EngineOutput(
            text=text,
            finish_reason=finish,
            prompt_tokens=n_prompt,
            completion_tokens=len(words),
            weight_version=self.weight_version,
            extra={
                "route_key": self.spec.route_key,
                "engine_id": self.engine_id,
                "call_index": self.calls,
                "batch_size": batch_size,
            },
        )
        if request.return_tokens:
            out.token_ids = [zlib.crc32(w.encode()) % 1000 for w in words]
            out.logprobs = [0.0] * len(words)
        return out

    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        if self.state != "awake":
            raise EngineAsleepError(f"engine {self.engine_id} is {self.state}")
        max_len = self.spec.engine_config.max_context_len
        counts = [self.prompt_tokens(r) for r in requests]
        for n in counts:
            if n > max_len:
                raise PromptTooLongError(n, max_len)
        self.calls += 1
        crash = self.script.crash_once_file
        if crash is not None:
            try:
                os.close(os.open(crash, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # crashed once already: this is the re-created engine
            else:
                self.crash()
        if self.failing is not None:
            raise EngineError(f"engine {self.engine_id}: {self.failing}")
        if self.script.fail_every and self.calls % self.script.fail_every == 0:
            raise EngineError(
                f"engine {self.engine_id}: injected failure on call {self.calls} "
                f"(fail_every={self.script.fail_every})"
            )
        marker = self.script.fail_when_contains
        if marker is not None and any(marker in _last_user(r) for r in requests):
            raise EngineError(f"engine {self.engine_id}: request contains {marker!r}")
        if self.script.delay_s:
            await asyncio.sleep(self.script.delay_s)
        return [self._one(r, n, len(requests)) for r, n in zip(requests, counts, strict=True)]

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "calls": self.calls}
