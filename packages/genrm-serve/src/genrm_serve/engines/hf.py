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

Memory on CUDA: ``engine_config.mem_fraction_static`` is the share of the device this engine may
hold. At start the weights are measured on the host before they go to the device: weights larger
than the share fail the start with the fraction and both sizes named; the rest of the share is the
batch budget (KV cache + activations per token, :func:`batch_token_budget`), so engines that share
a GPU at 0.6 + 0.3 cannot run each other out of memory. Without a fraction the budget is
:data:`MAX_BATCH_TOKENS`.

Sleep / wake: on CUDA the weights move into pinned host buffers allocated at the first sleep and
reused by every later one (``non_blocking`` copies, one synchronize, ``empty_cache``; see
``genrm_serve.engines.weights.HostOffloader``); on CPU the model object is dropped and reloaded
on wake — from ``model_path``, or, after ``update_weights``, from a snapshot this engine saved when
it went to sleep.

Weights from a trainer arrive as a state dict (object store), as flat bf16 buckets shared through
CUDA IPC by a trainer on the same GPU (:meth:`HFEngine.update_weights_from_ipc`), or broadcast per
bucket over a weight group with the trainer (:meth:`HFEngine.update_weights_from_broadcast`).
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
from collections.abc import Mapping
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
from genrm_serve.engines.weights import (
    BucketMeta,
    HostOffloader,
    WeightBroadcastGroup,
    dtype_from_name,
    open_ipc_handle,
    unpack_bucket,
)

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "MAX_BATCH_TOKENS",
    "HFEngine",
    "batch_token_budget",
    "model_bytes",
    "sample_next",
    "share_budget",
]

logger = logging.getLogger(__name__)

#: Upper bound on rows × (padded prompt + new tokens) of one forward batch.
MAX_BATCH_TOKENS = 65536
#: A shared prefix shorter than this is not worth a separate prefill.
MIN_SHARED_PREFIX = 32
#: Device memory outside the engine's control (CUDA context, allocator slack), kept out of the
#: batch budget derived from ``mem_fraction_static``.
RESERVED_BYTES = 1 << 30


def model_bytes(model: Any) -> int:
    """Bytes of a model's parameters and buffers (a tied weight once)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def batch_token_budget(config: Any, dtype: torch.dtype, free_bytes: int) -> int:
    """Tokens (rows × padded length) of one batch that fit into ``free_bytes``.

    Per token: its KV cache over every layer (2 × layers × kv heads × head dim) plus the
    largest activations of one layer's forward (hidden states, q/k/v, the MLP's gate and up
    projections; logits are only computed at the last position). Deliberately conservative: a
    co-resident engine's share is what is left.
    """
    text = getattr(config, "text_config", None) or config
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    layers = int(text.num_hidden_layers)
    inter = int(getattr(text, "intermediate_size", None) or 4 * hidden)
    kv = 2 * layers * kv_heads * head_dim
    act = 4 * hidden + (heads + 2 * kv_heads) * head_dim + 3 * inter
    return max(0, free_bytes // ((kv + act) * dtype.itemsize))


def share_budget(
    model: Any, dtype: torch.dtype, fraction: float, total_bytes: int, *, engine_id: str
) -> dict[str, int]:
    """What ``fraction`` of a device of ``total_bytes`` holds for this model: its share, the
    weights, and the batch token budget of the rest. Raises :class:`EngineError` naming the
    fraction and the sizes when the weights (plus :data:`RESERVED_BYTES`) do not fit."""
    share = int(fraction * total_bytes)
    weights = model_bytes(model)
    gib = 1024**3
    if weights + RESERVED_BYTES > share:
        raise EngineError(
            f"engine {engine_id}: mem_fraction_static={fraction} of {total_bytes / gib:.1f} GiB "
            f"is {share / gib:.2f} GiB, but the weights alone take {weights / gib:.2f} GiB "
            f"(+{RESERVED_BYTES / gib:.0f} GiB reserved): raise the fraction or use a smaller "
            "model"
        )
    tokens = batch_token_budget(model.config, dtype, share - weights - RESERVED_BYTES)
    if tokens < 1:
        raise EngineError(
            f"engine {engine_id}: mem_fraction_static={fraction} leaves no room for a batch "
            f"beside {weights / gib:.2f} GiB of weights"
        )
    return {"share_bytes": share, "weights_bytes": weights, "tokens": tokens}


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
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
        #: rows × padded length of one forward batch (from mem_fraction_static on CUDA)
        self.max_batch_tokens = MAX_BATCH_TOKENS
        #: what the share of the device holds (bytes), once started on CUDA
        self.memory_budget: dict[str, int] = {}
        self._host: HostOffloader | None = None
        self._weight_group: WeightBroadcastGroup | None = None
        #: seconds of the last sleep / wake / weight update, for the trainer's metrics
        self.timings: dict[str, float] = {}
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
        if self.device.type == "cuda" and not self.memory_budget:
            self._fit_share(model)  # before the weights take device memory
        return model.to(self.device).eval()

    def _fit_share(self, model: Any) -> None:
        """Check the weights fit ``mem_fraction_static`` of the device; size the batch budget."""
        fraction = self.spec.engine_config.mem_fraction_static
        if fraction is None:
            return
        total = torch.cuda.get_device_properties(self.device).total_memory
        self.memory_budget = share_budget(
            model, self.dtype, fraction, total, engine_id=self.engine_id
        )
        self.max_batch_tokens = self.memory_budget["tokens"]
        logger.info("engine %s: memory share %s", self.engine_id, self.memory_budget)

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

    def _engine_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"param:{n}": p for n, p in self.model.named_parameters()}
        out.update({f"buffer:{n}": b for n, b in self.model.named_buffers()})
        return out

    def _sleep(self) -> None:
        t0 = time.perf_counter()
        with self._lock:
            if self.device.type == "cuda":
                if self._host is None:
                    self._host = HostOffloader(self._engine_tensors)
                self._host.offload()  # pinned buffers reused across sleeps, then empty_cache
                self.timings["sleep_s"] = time.perf_counter() - t0
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
        t0 = time.perf_counter()
        with self._lock:
            if self.device.type == "cuda":
                assert self._host is not None
                self._host.onload()
                self.timings["wake_s"] = time.perf_counter() - t0
                return
            assert self.model_dir is not None
            source = self._snapshot_dir if self.weight_version else self.model_dir
            self.model = self._load_model(source)  # type: ignore[arg-type]

    def _check_update(self, version: int) -> None:
        if self.state != "awake":
            raise EngineAsleepError(f"engine {self.engine_id} is {self.state}: wake it first")
        if version <= self.weight_version:
            raise EngineError(
                f"engine {self.engine_id}: weight version {version} must be greater than "
                f"{self.weight_version}"
            )

    async def update_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Copy ``state_dict`` (name → tensor, a subset is fine) into the model; awake only."""
        self._check_update(version)
        t0 = time.perf_counter()
        await asyncio.to_thread(self._update, state_dict)
        self.weight_version = version
        self.timings["weight_update_s"] = time.perf_counter() - t0

    async def update_weights_from_ipc(
        self, buckets: list[tuple[BucketMeta, Any]], version: int, done: bool = True
    ) -> None:
        """Copy flat buckets shared by a trainer on this GPU (``ipc_handle``) into the model.

        A sync may come in several calls (one bucket each, so the trainer holds one bucket at a
        time); the weight version moves to ``version`` with the call marked ``done``. The copy
        is finished (synchronized) when this returns, so the trainer may free the buckets.
        """
        self._check_update(version)
        if self.device.type != "cuda":
            raise EngineError(f"engine {self.engine_id}: CUDA IPC weights need a CUDA engine")
        t0 = time.perf_counter()

        def load() -> None:
            for meta, handle in buckets:
                flat = open_ipc_handle(handle, self.device.index)
                self._update(unpack_bucket(flat, meta))
                del flat
            torch.cuda.synchronize(self.device)

        await asyncio.to_thread(load)
        if done:
            self.weight_version = version
        self.timings["weight_update_s"] = time.perf_counter() - t0

    async def init_weight_group(
        self, host: str, port: int, rank: int, world_size: int, backend: str = "nccl"
    ) -> None:
        """Join the weight-broadcast group of trainer rank 0 (rank 0) and the engines."""
        self._weight_group = await asyncio.to_thread(
            WeightBroadcastGroup, host, port, rank, world_size, backend=backend
        )

    async def update_weights_from_broadcast(self, buckets: list[BucketMeta], version: int) -> None:
        """Receive every bucket of a sync from the weight group, then serve ``version``."""
        self._check_update(version)
        group = self._weight_group
        if group is None:
            raise EngineError(f"engine {self.engine_id}: no weight group (init_weight_group)")
        t0 = time.perf_counter()

        def receive() -> None:
            for meta in buckets:
                dtype = dtype_from_name(meta.dtype)
                flat = torch.empty(meta.numel, dtype=dtype, device=self.device)
                group.broadcast(flat)
                self._update(unpack_bucket(flat, meta))
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        await asyncio.to_thread(receive)
        self.weight_version = version
        self.timings["weight_update_s"] = time.perf_counter() - t0

    def _update(self, state_dict: Mapping[str, Any]) -> None:
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
        out = {
            **super().stats(),
            **self.counters,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "torch_threads": torch.get_num_threads(),
            "max_batch_tokens": self.max_batch_tokens,
            **self.memory_budget,
            **{f"time_{k}": v for k, v in self.timings.items()},
        }
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            out |= {"gpu_used_bytes": total - free, "gpu_total_bytes": total}
            out["gpu_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
        return out

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
                len(current) >= max_rows or new_width * (len(current) + 1) > self.max_batch_tokens
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
