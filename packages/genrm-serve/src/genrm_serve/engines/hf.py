"""The embedded engine: a transformers causal LM, in-process, on CPU or one CUDA device.

Why a hand-written decode loop rather than ``model.generate``: a batch mixes requests with their
own temperature / top-p / top-k / seed / stop strings, and rollout needs, per sampled token, its
log-prob under the distribution it was drawn from *and* under the raw model — one loop over one
KV cache gives all of that without a second forward pass.

Memory is bounded by construction, not by free RAM: requests run as *static* left-padded batches
of at most ``engine_config.max_batch_size`` rows, split further so that rows × (padded prompt +
new tokens) stays under :data:`MAX_BATCH_TOKENS`; the KV cache is a ``DynamicCache`` that grows
only to that size, and logits are computed for the last position only (``logits_to_keep=1``; a
full-sequence logits tensor of a 262k vocabulary would be gigabytes). transformers' continuous
batching is not used: by default it sizes its KV cache from free RAM (9.7 GB on the CI machines).

Requests of a batch that share a prompt prefix (the n samples of a GRPO group; judge prompts with
one long instruction) compute that prefix's KV once; the cache is then repeated for each row and
only the distinct suffixes are prefilled (:func:`_common_prefix_len`).

Sleep / wake: on CUDA the weights move to CPU RAM and back (``empty_cache`` in between); on CPU
the model object is dropped and reloaded on wake — from ``model_path``, or, after
``update_weights``, from a snapshot this engine saved when it went to sleep.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from genrm_client.types import FinishReason, SamplingParams
from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineError,
    EngineOutput,
    EngineRequest,
)
from genrm_serve.engines.prompts import FALLBACK_CHAT_TEMPLATE, PromptEncoder
from genrm_serve.precision import resolve_bf16

__all__ = ["FALLBACK_CHAT_TEMPLATE", "MAX_BATCH_TOKENS", "HFEngine", "sample_next"]

logger = logging.getLogger(__name__)

#: Upper bound on rows × (padded prompt + new tokens) of one forward batch.
MAX_BATCH_TOKENS = 65536
#: A shared prefix shorter than this is not worth a separate prefill.
MIN_SHARED_PREFIX = 32


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if device.type == "cpu" and name in ("auto", "bfloat16"):
        # bf16 on a CPU only with native bf16 (emulated it is >100x slower); see precision.py
        asked = None if name == "auto" else True
        bf16, _why = resolve_bf16(asked, device, what='engine_config.dtype="bfloat16"')
        return torch.bfloat16 if bf16 else torch.float32
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _resolve_device(name: str) -> torch.device:
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise EngineError("engine_config.device='cuda' but no CUDA device is visible")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[int, float, float]:
    """Pick one token from a row of float32 logits; return (token, logprob, raw_logprob).

    ``logprob`` is ``log_softmax(logits / temperature)`` at the token — the temperature-scaled
    distribution, *before* top-k / top-p truncation; with temperature 0 (greedy) it equals
    ``raw_logprob``, ``log_softmax(logits)`` (the model's own distribution at temperature 1).
    """
    raw = torch.log_softmax(logits, dim=-1)
    temperature = sampling.temperature or 0.0
    if temperature <= 0.0:
        token = int(torch.argmax(logits))
        return token, float(raw[token]), float(raw[token])
    scaled = torch.log_softmax(logits / temperature, dim=-1)
    filtered = scaled.clone()
    top_k = sampling.top_k if sampling.top_k is not None else -1
    if 0 < top_k < filtered.numel():
        kth = torch.topk(filtered, top_k).values[-1]
        filtered[filtered < kth] = -float("inf")
    top_p = sampling.top_p if sampling.top_p is not None else 1.0
    if top_p < 1.0:
        sorted_lp, order = torch.sort(filtered, descending=True)
        probs = torch.softmax(sorted_lp, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
        drop = before >= top_p
        drop[0] = False
        filtered[order[drop]] = -float("inf")
    probs = torch.softmax(filtered, dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(scaled[token]), float(raw[token])


def _common_prefix_len(rows: list[list[int]]) -> int:
    first = rows[0]
    n = min(len(r) for r in rows)
    for other in rows[1:]:
        i = 0
        while i < n and other[i] == first[i]:
            i += 1
        n = i
    return n


@dataclass
class _Row:
    request: EngineRequest
    prompt: list[int]
    max_new: int
    generator: torch.Generator | None
    stop_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    raw_logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None
    text: str = ""


class HFEngine(Engine):
    """transformers engine; see the module docstring for batching, memory and sleep."""

    def __init__(self, spec: InstanceSpec, engine_id: str) -> None:
        super().__init__(spec, engine_id)
        self.model: Any = None
        self.prompts: PromptEncoder | None = None
        self.model_dir: Path | None = None
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self._snapshot_dir: Path | None = None
        self._snapshot_version = 0
        self._eos_ids: frozenset[int] = frozenset()
        self._generator = torch.Generator(device="cpu")
        self._generator.seed()
        self._cache_kw = "cache"
        self._lock = threading.Lock()  # one forward at a time; sleep/update wait for it
        self.counters = {"batches": 0, "prefix_shared_tokens": 0, "forward_tokens": 0}

    # -- loading -----------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self.state = "awake"

    def _load(self) -> None:
        from transformers import AutoTokenizer

        from genrm_serve.models import resolve_model_path

        t0 = time.monotonic()
        self.model_dir = resolve_model_path(self.spec.model_path)
        cfg = self.spec.engine_config
        self.device = _resolve_device(cfg.device)
        self.dtype = _resolve_dtype(cfg.dtype, self.device)
        if self.device.type == "cpu":
            # Ray sets OMP_NUM_THREADS=1 in an actor with fractional CPUs, which would halve a
            # CPU engine on the 2-core machines; use the cores this process may run on instead.
            threads = int(os.environ.get("GENRM_HF_NUM_THREADS", "0")) or len(
                os.sched_getaffinity(0)
            )
            torch.set_num_threads(threads)
        self.prompts = PromptEncoder(
            AutoTokenizer.from_pretrained(self.model_dir), cfg.max_context_len
        )
        tok = self.prompts.tokenizer
        self.model = self._load_model(self.model_dir)
        eos: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, tok.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(x) for x in source)
        self._eos_ids = frozenset(eos)
        logger.info(
            "engine %s: loaded %s on %s (%s) in %.1f s",
            self.engine_id,
            self.model_dir,
            self.device,
            self.dtype,
            time.monotonic() - t0,
        )

    def _load_model(self, path: Path) -> Any:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        # transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns).
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        return model.to(self.device).eval()

    # -- prompts -----------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        if self.prompts is None:
            raise EngineError(f"engine {self.engine_id} is not started")
        return self.prompts.tokenizer

    def encode(self, request: EngineRequest) -> list[int]:
        """The prompt's token ids (chat template with ``chat_template_kwargs`` applied)."""
        assert self.prompts is not None
        return self.prompts.encode(request)

    def render(self, request: EngineRequest) -> str:
        """The prompt text of a chat request."""
        assert self.prompts is not None
        return self.prompts.render(request)

    # -- lifecycle ---------------------------------------------------------------------------
    async def sleep(self) -> None:
        if self.state != "awake":
            return
        await asyncio.to_thread(self._sleep)
        self.state = "asleep"

    def _sleep(self) -> None:
        with self._lock:
            if self.device.type == "cuda":
                self.model.to("cpu")
                torch.cuda.empty_cache()
                return
            if self.weight_version != self._snapshot_version:
                if self._snapshot_dir is None:
                    self._snapshot_dir = Path(tempfile.mkdtemp(prefix="genrm-hf-weights-"))
                self.model.save_pretrained(self._snapshot_dir)
                self._snapshot_version = self.weight_version
            self.model = None
            gc.collect()

    async def wake(self) -> None:
        if self.state != "asleep":
            return
        await asyncio.to_thread(self._wake)
        self.state = "awake"

    def _wake(self) -> None:
        with self._lock:
            if self.device.type == "cuda":
                self.model.to(self.device)
                return
            assert self.model_dir is not None
            source = self._snapshot_dir if self.weight_version else self.model_dir
            self.model = self._load_model(source)  # type: ignore[arg-type]

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Copy ``state_dict`` (name → tensor, a subset is fine) into the model; awake only."""
        if self.state != "awake":
            raise EngineAsleepError(f"engine {self.engine_id} is {self.state}: wake it first")
        if version <= self.weight_version:
            raise EngineError(
                f"engine {self.engine_id}: weight version {version} must be greater than "
                f"{self.weight_version}"
            )
        await asyncio.to_thread(self._update, state_dict)
        self.weight_version = version

    def _update(self, state_dict: dict[str, Any]) -> None:
        with self._lock, torch.no_grad():
            params = dict(self.model.named_parameters())
            params.update(dict(self.model.named_buffers()))
            unknown = sorted(set(state_dict) - set(params))
            if unknown:
                raise EngineError(
                    f"engine {self.engine_id}: update_weights got unknown parameter(s) "
                    f"{unknown[:5]}{'...' if len(unknown) > 5 else ''}"
                )
            for name, value in state_dict.items():
                target = params[name]
                tensor = torch.as_tensor(value)
                if tuple(tensor.shape) != tuple(target.shape):
                    raise EngineError(
                        f"engine {self.engine_id}: update_weights {name}: shape "
                        f"{tuple(tensor.shape)} != {tuple(target.shape)}"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))

    async def shutdown(self) -> None:
        self.model = None
        if self._snapshot_dir is not None:
            shutil.rmtree(self._snapshot_dir, ignore_errors=True)
        gc.collect()

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            **self.counters,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
        }

    # -- generation --------------------------------------------------------------------------
    async def generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        if self.state != "awake":
            raise EngineAsleepError(f"engine {self.engine_id} is {self.state}")
        if not requests:
            return []
        return await asyncio.to_thread(self._generate, requests)

    def _make_row(self, request: EngineRequest) -> _Row:
        assert self.prompts is not None
        prompt = self.prompts.checked(request)
        default = self.spec.sampling_config.max_response_len or 1
        generator = None
        if request.sampling.seed is not None:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(request.sampling.seed)
        return _Row(
            request=request,
            prompt=prompt,
            max_new=self.prompts.max_new_tokens(request, len(prompt), default),
            generator=generator,
            stop_ids=self._eos_ids,
        )

    def _generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        t0 = time.monotonic()
        rows = [self._make_row(r) for r in requests]  # every length check before any compute
        with self._lock:
            if self.model is None:
                raise EngineAsleepError(f"engine {self.engine_id} is asleep")
            for chunk in self._chunks(rows):
                self._run_chunk(chunk)
        self.counters["batches"] += 1
        elapsed = time.monotonic() - t0
        return [self._output(row, elapsed, len(rows)) for row in rows]

    def _chunks(self, rows: list[_Row]) -> list[list[_Row]]:
        """Sub-batches bounded by ``max_batch_size`` rows and :data:`MAX_BATCH_TOKENS` tokens."""
        max_rows = self.spec.engine_config.max_batch_size
        chunks: list[list[_Row]] = []
        current: list[_Row] = []
        width = 0
        for row in rows:
            need = len(row.prompt) + row.max_new
            new_width = max(width, need)
            if current and (
                len(current) >= max_rows or new_width * (len(current) + 1) > MAX_BATCH_TOKENS
            ):
                chunks.append(current)
                current, new_width = [], need
            current.append(row)
            width = new_width
        if current:
            chunks.append(current)
        return chunks

    @torch.inference_mode()
    def _run_chunk(self, rows: list[_Row]) -> None:
        from transformers import DynamicCache

        pad = int(self.tokenizer.pad_token_id)
        n = len(rows)
        cache = DynamicCache(config=self.model.config)
        shared = _common_prefix_len([r.prompt for r in rows]) if n > 1 else 0
        # Keep at least one private token per row so that every row has its own last logits.
        shared = min(shared, min(len(r.prompt) for r in rows) - 1)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        if shared:
            prefix = torch.tensor([rows[0].prompt[:shared]], device=self.device)
            self.model(
                input_ids=prefix, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}
            )
            cache.batch_repeat_interleave(n)
            self.counters["prefix_shared_tokens"] += shared * (n - 1)
        suffixes = [r.prompt[shared:] for r in rows]
        width = max(len(s) for s in suffixes)
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for i, s in enumerate(suffixes):
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, shared + width - len(s) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        ids, mask, positions = (t.to(self.device) for t in (ids, mask, positions))
        self.counters["forward_tokens"] += n * width
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: cache},
        )
        last_pos = positions[:, -1]
        for row in rows:
            if row.max_new == 0:
                row.finish = "length"
        # ``live``: the rows still present in the batch tensors and the cache, in order. Rows that
        # finish are dropped from the cache, so a long rollout does not drag finished ones along.
        live = list(range(n))
        steps = max(r.max_new for r in rows)
        for step in range(steps):
            logits = out.logits[:, -1, :].float().cpu()
            for j, i in enumerate(live):
                row = rows[i]
                if row.finish is not None:
                    continue
                gen = row.generator if row.generator is not None else self._generator
                token, lp, raw = sample_next(logits[j], row.request.sampling, gen)
                row.tokens.append(token)
                row.logprobs.append(lp)
                row.raw_logprobs.append(raw)
                self._finished(row)
            keep = [j for j, i in enumerate(live) if rows[i].finish is None]
            if not keep or step == steps - 1:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, last_pos = mask[index], last_pos[index]
                live = [live[j] for j in keep]
            last_pos = last_pos + 1
            ones = torch.ones((len(live), 1), dtype=mask.dtype, device=mask.device)
            mask = torch.cat([mask, ones], 1)
            self.counters["forward_tokens"] += len(live)
            out = self.model(
                input_ids=torch.tensor([[rows[i].tokens[-1]] for i in live], device=self.device),
                attention_mask=mask,
                position_ids=last_pos.unsqueeze(1),
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: cache},
            )
        for row in rows:
            if row.finish is None:
                row.finish = "length"
                row.text = self._decode(row.tokens)

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    def _finished(self, row: _Row) -> bool:
        """Set ``finish``/``text`` when the row just hit EOS, a stop string or its length."""
        if row.tokens[-1] in row.stop_ids:
            row.finish = "stop"
            row.text = self._decode(row.tokens[:-1])
            return True
        stops = row.request.sampling.stop or []
        if stops:
            text = self._decode(row.tokens)
            cut = min((i for s in stops if s and (i := text.find(s)) >= 0), default=None)
            if cut is not None:
                row.finish = "stop"
                row.text = text[:cut]
                return True
        if len(row.tokens) >= row.max_new:
            row.finish = "length"
            row.text = self._decode(row.tokens)
            return True
        return False

    def _output(self, row: _Row, elapsed: float, batch: int) -> EngineOutput:
        assert row.finish is not None
        out = EngineOutput(
            text=row.text,
            finish_reason=row.finish,
            prompt_tokens=len(row.prompt),
            completion_tokens=len(row.tokens),
            latency_s=elapsed,
            weight_version=self.weight_version,
            extra={"route_key": self.spec.route_key, "engine_id": self.engine_id},
        )
        if row.request.return_tokens:
            out.token_ids = list(row.tokens)
            out.logprobs = list(row.logprobs)
            out.raw_logprobs = list(row.raw_logprobs)
            out.extra["prompt_token_ids"] = list(row.prompt)
        return out
