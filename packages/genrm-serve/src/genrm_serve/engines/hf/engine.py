"""The embedded engine: a transformers causal LM, in-process, on CPU or one CUDA device.

Why a hand-written decode loop rather than ``model.generate``: a batch mixes requests with their
own temperature / top-p / top-k / seed / stop strings, and rollout needs, per sampled token, its
log-prob under the distribution it was drawn from *and* under the raw model — one loop over one
KV cache gives all of that without a second forward pass.

A batch is one *packed prefill* (:mod:`genrm_serve.engines.hf.packing`): the prompts go into a
radix tree over token ids, every shared run (a GRPO group's template + question + reference, a
template common to all groups) is computed once, and the tree's nodes are laid end to end in one
sequence with no padding; logits are computed only at each row's last prompt token. That one
forward gives every row its first reply token, so a one-token verdict costs no decode step at
all. Rows that need more tokens continue from a static KV cache gathered out of the prefill, and
sampling runs batched on the logits' device (:mod:`genrm_serve.engines.hf.sampling`): per step
only the chosen tokens and their log-probs reach the host.

Memory is bounded by construction, not by free RAM: a batch runs as chunks of rows within a
token budget (:mod:`genrm_serve.engines.hf.batching` decides which rows go together, in prompt
order so that a group's rows share one prefill). transformers' continuous batching is not used:
by default it sizes its KV cache from free RAM (9.7 GB on the CI machines).

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
it went to sleep (:mod:`genrm_serve.engines.hf.snapshot`, which also removes the snapshots of
engines killed without their shutdown).

Weights from a trainer arrive as a state dict (object store), as flat bf16 buckets shared through
CUDA IPC by a trainer on the same GPU (:meth:`HFEngine.update_weights_from_ipc`), or broadcast per
bucket over a weight group with the trainer (:meth:`HFEngine.update_weights_from_broadcast`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch

from genrm_serve.config import InstanceSpec
from genrm_serve.engines.base import (
    Engine,
    EngineAsleepError,
    EngineBatchError,
    EngineError,
    EngineOutput,
    EngineRequest,
    RequestRefusedError,
    VerdictUnavailableError,
)
from genrm_serve.engines.hf.batching import Row, split_chunks
from genrm_serve.engines.hf.decode_step import DecodeStep
from genrm_serve.engines.hf.packing import (
    DecodeState,
    PackedPlan,
    activate,
    build_plan,
    register_attention,
)
from genrm_serve.engines.hf.sampling import RowSampling, sample
from genrm_serve.engines.hf.snapshot import WeightSnapshot, sweep_orphans
from genrm_serve.engines.prompts import FALLBACK_CHAT_TEMPLATE, PromptEncoder
from genrm_serve.engines.wake_check import WakeCheck, logprob_tolerance
from genrm_serve.engines.weights import (
    BucketMeta,
    HostOffloader,
    WeightBroadcastGroup,
    dtype_from_name,
    open_ipc_handle,
    unpack_bucket,
)
from genrm_serve.precision import resolve_bf16

__all__ = [
    "FALLBACK_CHAT_TEMPLATE",
    "MAX_BATCH_TOKENS",
    "HFEngine",
    "VerdictUnavailableError",
    "batch_token_budget",
    "model_bytes",
    "share_budget",
]

logger = logging.getLogger(__name__)

#: Upper bound on the tokens one chunk of a batch holds at once (``batching.split_chunks``).
MAX_BATCH_TOKENS = 65536
#: A batch decodes through a CUDA graph only when it runs at least this many steps: a capture
#: costs about two eager steps (``GENRM_HF_CUDA_GRAPHS=0`` turns graphs off).
GRAPH_MIN_STEPS = 8
#: Device memory outside the engine's control (CUDA context, allocator slack), kept out of the
#: batch budget derived from ``mem_fraction_static``.
RESERVED_BYTES = 1 << 30


def model_bytes(model: Any) -> int:
    """Bytes of a model's parameters and buffers (a tied weight once)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def batch_token_budget(config: Any, dtype: torch.dtype, free_bytes: int) -> int:
    """Tokens one batch may hold at once (see ``batching.chunk_cost``) within ``free_bytes``.

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


def _adapter_tensor_names(adapter: Path) -> set[str]:
    """Names of the tensors in an adapter folder's weights file (peft's key layout)."""
    st = adapter / "adapter_model.safetensors"
    if st.is_file():
        from safetensors import safe_open

        with safe_open(str(st), framework="pt") as f:
            return {_without_adapter_name(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    state = torch.load(adapter / "adapter_model.bin", map_location="cpu", weights_only=True)
    return {_without_adapter_name(k) for k in state}


def _without_adapter_name(key: str) -> str:
    """``...lora_A.default.weight`` and ``...lora_A.weight`` name the same tensor."""
    return key.replace(".default.", ".")


class HFEngine(Engine):
    """transformers engine; see the module docstring for batching, memory and sleep."""

    def __init__(self, spec: InstanceSpec, engine_id: str) -> None:
        super().__init__(spec, engine_id)
        self.model: Any = None
        self.prompts: PromptEncoder | None = None
        self.model_dir: Path | None = None
        #: the LoRA adapter merged into the weights at every load from ``model_dir`` (None: none)
        self.adapter_dir: Path | None = None
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self._snapshot = WeightSnapshot()  # CPU sleep after update_weights saves here
        self._snapshot_version = 0
        self._eos_ids: frozenset[int] = frozenset()
        self._generator = torch.Generator(device="cpu")
        self._generator.seed()
        self._lock = threading.Lock()  # one forward at a time; sleep/update wait for it
        self._compiled_layers: list[Any] = []
        #: decode steps as CUDA graphs on CUDA (cleared when a capture fails)
        self.decode_graphs = os.environ.get("GENRM_HF_CUDA_GRAPHS", "1") != "0"
        #: force the fixed-shape decode on (or off) whatever the device: what CPU tests use
        self.static_decode: bool | None = None
        #: rows × padded length of one forward batch (from mem_fraction_static on CUDA)
        self.max_batch_tokens = MAX_BATCH_TOKENS
        #: what the share of the device holds (bytes), once started on CUDA
        self.memory_budget: dict[str, int] = {}
        self._host: HostOffloader | None = None
        self._weight_group: WeightBroadcastGroup | None = None
        #: seconds of the last sleep / wake / weight update, for the trainer's metrics
        self.timings: dict[str, float] = {}
        #: seconds spent so far checking and tokenizing prompts, and running batches on the model
        #: (where a batch's time goes, wherever the engine runs: in process or in an actor)
        self.busy_s = {"prompts": 0.0, "compute": 0.0}
        #: batches: generate calls; chunks: packed prefills (at most max_batch_size rows each)
        self.counters = {
            "batches": 0,
            "chunks": 0,
            "prefix_shared_tokens": 0,
            "forward_tokens": 0,
            "decode_graphs": 0,  # decode steps captured as CUDA graphs
        }
        #: proves after each wake that the weights survived the sleep (``wake_check.py``)
        self.wake_check = WakeCheck(self, self.counters)

    # -- loading -----------------------------------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self.state = "awake"

    def _load(self) -> None:
        from transformers import AutoTokenizer

        from genrm_serve.models import resolve_adapter, resolve_model_path

        t0 = time.monotonic()
        cfg = self.spec.engine_config
        try:
            self.adapter_dir = resolve_adapter(self.spec.model_path, cfg.adapter_path)
        except (FileNotFoundError, ValueError) as err:
            raise EngineError(f"engine {self.engine_id}: {err}") from err
        self.model_dir = resolve_model_path(self.spec.model_path)
        self.device = _resolve_device(cfg.device)
        self.dtype = _resolve_dtype(cfg.dtype, self.device)
        self.wake_check.tolerance = logprob_tolerance(str(self.dtype))  # the logits' dtype
        if self.device.type == "cpu":
            sweep_orphans()  # what engines killed without their shutdown left in the temp dir
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
        if (
            self.device.type == "cuda"
            and cfg.sleep_buffers == "start"
            and not cfg.sleep_keeps_weights
        ):
            self._host = HostOffloader(self._engine_tensors)
            self._host.reserve()  # pinned now: the first sleep is a copy like every later one
        eos: set[int] = set()
        for source in (self.model.generation_config.eos_token_id, tok.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(x) for x in source)
        self._eos_ids = frozenset(eos)
        logger.info(
            "engine %s: loaded %s%s on %s (%s) in %.1f s",
            self.engine_id,
            self.model_dir,
            f" + adapter {self.adapter_dir}" if self.adapter_dir else "",
            self.device,
            self.dtype,
            time.monotonic() - t0,
        )

    def _load_model(self, path: Path) -> Any:
        from transformers import AutoModelForCausalLM

        # a snapshot saved at sleep after update_weights holds merged weights already
        adapter = self.adapter_dir if path == self.model_dir else None
        model: Any = AutoModelForCausalLM.from_pretrained(
            path,
            # merged in fp32, then cast: a bf16 merge would round the small update away
            dtype=torch.float32 if adapter is not None else self.dtype,
            attn_implementation=register_attention(),
        )
        if adapter is not None:
            model = self._merge_adapter(model, adapter).to(self.dtype)
        if self.device.type == "cuda" and not self.memory_budget:
            self._fit_share(model)  # before the weights take device memory
        model = model.to(self.device).eval()
        self._compile(model)
        return model

    def _merge_adapter(self, model: Any, adapter: Path) -> Any:
        """``model`` with the LoRA adapter at ``adapter`` merged into its weights.

        Merged rather than kept as side branches: inference then costs exactly what the base
        costs (on either CPU kind), and weight updates, sleep and packing see plain weights.
        Every tensor of the adapter file must land in a module of the model: an adapter made
        for another architecture fails here instead of merging as a silent no-op.
        """
        from peft import PeftModel, get_peft_model_state_dict

        where = f"engine {self.engine_id}: engine_config.adapter_path={str(adapter)!r}"
        try:
            peft_model: Any = PeftModel.from_pretrained(model, str(adapter))
        except Exception as err:
            raise EngineError(f"{where}: cannot be applied to {self.model_dir}: {err}") from err
        expected = _adapter_tensor_names(adapter)
        # The names only, for the check below. peft's default ("auto") decides whether whole
        # embedding layers belong by reading the base's config.json at the adapter's
        # base_model_name_or_path, on the Hub when it is no folder ("embedded"): a lookup and a
        # warning on every start. The adapter file says it itself: a full embedding tensor in it.
        embeddings = any(
            name.endswith(f"{layer}.weight") and "lora_" not in name
            for name in expected
            for layer in ("embed_tokens", "lm_head")
        )
        loaded = {
            _without_adapter_name(k)
            for k in get_peft_model_state_dict(peft_model, save_embedding_layers=embeddings)
        }
        if expected != loaded:
            raise EngineError(
                f"{where}: does not fit {self.model_dir}: tensors without a module "
                f"{sorted(expected - loaded)[:3]}, modules without a tensor "
                f"{sorted(loaded - expected)[:3]}"
            )
        return peft_model.merge_and_unload()

    def _compile(self, model: Any) -> None:
        """On CUDA, compile each decoder layer (``GENRM_HF_COMPILE=0`` turns it off).

        Outside attention a layer is a chain of small element-wise kernels (norms, rotary, the
        gated MLP) that eager mode runs one by one; compiled, they fuse. One compiled layer serves
        every layer (same code, the weights are inputs), with dynamic shapes, so the first batch
        pays ~15 s once and later shapes do not recompile. The attention is one opaque op in
        the layer's graph (``packing.packed_attention``), so each layer is a single graph.
        """
        layers = getattr(getattr(model, "model", None), "layers", None)
        if self.device.type != "cuda" or os.environ.get("GENRM_HF_COMPILE", "1") == "0":
            return
        if layers is None:
            return
        for layer in layers:
            layer.compile(dynamic=True)
        self._compiled_layers = list(layers)

    def _forward(self, **kwargs: Any) -> Any:
        """The model's forward; a compiler failure falls back to eager (logged), once."""
        try:
            return self.model(**kwargs)
        except Exception as err:
            if not self._compiled_layers or not type(err).__module__.startswith("torch._"):
                raise
            logger.warning("engine %s: compiled layers failed (%s); eager", self.engine_id, err)
            for layer in self._compiled_layers:
                layer._compiled_call_impl = None
            self._compiled_layers = []
            return self.model(**kwargs)

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
        await self.wake_check.before_sleep(self.tokenizer.vocab_size)
        await asyncio.to_thread(self._sleep)
        self.state = "asleep"

    def _engine_tensors(self) -> dict[str, torch.Tensor]:
        out = {f"param:{n}": p for n, p in self.model.named_parameters()}
        out.update({f"buffer:{n}": b for n, b in self.model.named_buffers()})
        return out

    def _sleep(self) -> None:
        t0 = time.perf_counter()
        with self._lock:
            if self.spec.engine_config.sleep_keeps_weights:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()  # what requests left cached; the weights stay
                self.timings["sleep_s"] = time.perf_counter() - t0
                return
            if self.device.type == "cuda":
                if self._host is None:
                    self._host = HostOffloader(self._engine_tensors)
                self._host.offload()  # pinned buffers reused across sleeps, then empty_cache
                self.timings["sleep_s"] = time.perf_counter() - t0
                return
            if self.weight_version != self._snapshot_version:
                self.model.save_pretrained(self._snapshot.folder())
                self._snapshot_version = self.weight_version
            self.model = None
            gc.collect()

    async def wake(self) -> None:
        if self.state != "asleep":
            return
        await asyncio.to_thread(self._wake)
        self.state = "awake"
        await self.wake_check.after_wake()

    def _wake(self) -> None:
        t0 = time.perf_counter()
        with self._lock:
            if self.spec.engine_config.sleep_keeps_weights:
                self.timings["wake_s"] = time.perf_counter() - t0
                return
            if self.device.type == "cuda":
                assert self._host is not None
                self._host.onload()
                self.timings["wake_s"] = time.perf_counter() - t0
                return
            assert self.model_dir is not None
            source = self._snapshot.path if self.weight_version else self.model_dir
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
        self.wake_check.invalidate()
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
        self.wake_check.invalidate()  # per call: a sync of several calls changes weights in each
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
        self.wake_check.invalidate()
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
        self._snapshot.remove()
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
            **{f"busy_{k}_s": v for k, v in self.busy_s.items()},
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

    def _verdict_tokens(self, request: EngineRequest) -> tuple[int, int]:
        assert self.prompts is not None
        return self.prompts.verdict_tokens(request)

    def _make_row(
        self, request: EngineRequest, prompt: list[int] | RequestRefusedError | None = None
    ) -> Row:
        """A request's row; ``prompt`` is what :meth:`PromptEncoder.checked_many` made of it
        (its token ids, or its refusal) when already encoded."""
        assert self.prompts is not None
        if request.sampling.logprob_verdict:
            self._verdict_tokens(request)  # refused before any compute
        if prompt is None:
            prompt = self.prompts.checked(request)
        if isinstance(prompt, RequestRefusedError):
            raise prompt
        default = self.spec.sampling_config.max_response_len or 1
        seed = request.sampling.seed
        if seed is None:
            seed = int(torch.randint(0, 2**32, (1,), generator=self._generator))
        return Row(
            request=request,
            prompt=prompt,
            max_new=self.prompts.max_new_tokens(request, len(prompt), default),
            seed=seed,
        )

    def _generate(self, requests: list[EngineRequest]) -> list[EngineOutput]:
        t0 = time.monotonic()
        # Every check before any compute; a refused request fails alone, the others run.
        assert self.prompts is not None
        entries: list[Row | RequestRefusedError] = []
        for request, prompt in zip(requests, self.prompts.checked_many(requests), strict=True):
            try:
                entries.append(self._make_row(request, prompt))
            except RequestRefusedError as err:
                entries.append(err)
        rows = [e for e in entries if isinstance(e, Row)]
        t1 = time.monotonic()
        self.busy_s["prompts"] += t1 - t0
        if len(entries) == 1 and not rows:
            raise cast(RequestRefusedError, entries[0])
        if rows:
            with self._lock:
                if self.model is None:
                    raise EngineAsleepError(f"engine {self.engine_id} is asleep")
                for chunk in self._chunks(rows):
                    self._run_chunk(chunk)
            self.counters["batches"] += 1
            self.busy_s["compute"] += time.monotonic() - t1
        elapsed = time.monotonic() - t0
        who = {"route_key": self.spec.route_key, "engine_id": self.engine_id}
        outputs: list[EngineOutput | BaseException] = [
            e.output(elapsed, self.weight_version, who) if isinstance(e, Row) else e
            for e in entries
        ]
        if len(rows) < len(entries):
            raise EngineBatchError(outputs)
        return cast(list[EngineOutput], outputs)

    def _chunks(self, rows: list[Row]) -> list[list[Row]]:
        """``rows`` cut into the chunks this engine runs (its row and token budgets)."""
        return split_chunks(rows, self.spec.engine_config.max_batch_size, self.max_batch_tokens)

    @torch.inference_mode()
    def _run_chunk(self, rows: list[Row]) -> None:
        """One packed prefill (every row's first token), then batched decoding of the rest."""
        plan = build_plan([r.prompt for r in rows], self.device)
        self.counters["chunks"] += 1
        if any(r.max_new > 1 for r in rows):
            plan.captured = {}
        self.counters["prefix_shared_tokens"] += plan.shared_tokens
        for row, shared in zip(rows, plan.shared_per_row(), strict=True):
            row.shared_prompt_tokens = shared
        self.counters["forward_tokens"] += plan.num_tokens
        ends = sorted(set(plan.last_index))
        keep = torch.tensor(ends, dtype=torch.long, device=self.device)
        with activate(plan):
            out = self._forward(
                input_ids=plan.input_ids,
                position_ids=plan.position_ids,
                use_cache=False,
                logits_to_keep=keep,
            )
        at = {e: i for i, e in enumerate(ends)}
        row_of = torch.tensor([at[e] for e in plan.last_index], device=self.device)
        logits = out.logits[0].index_select(0, row_of).float()  # [rows, vocab]
        del out
        self._verdicts(rows, logits)
        for row in rows:
            if row.max_new == 0:
                row.finish_reason = "length"
        live = [i for i, r in enumerate(rows) if r.max_new > 0]
        if live:
            self._decode_rows(rows, live, logits, plan)
        plan.captured = None

    def _verdicts(self, rows: list[Row], logits: torch.Tensor) -> None:
        """P("1") / (P("1") + P("0")) at the first reply position, for the rows that ask."""
        asking = [i for i, r in enumerate(rows) if r.request.sampling.logprob_verdict]
        if not asking:
            return
        one, zero = self._verdict_tokens(rows[asking[0]].request)
        index = torch.tensor(asking, dtype=torch.long, device=logits.device)
        picked = logits.index_select(0, index)[:, [one, zero]]
        probs = torch.sigmoid(picked[:, 0] - picked[:, 1]).cpu().tolist()
        for i, p in zip(asking, probs, strict=True):
            rows[i].verdict_prob = float(p)

    def _static_decode(self, steps: int) -> bool:
        """Whether this batch keeps a fixed shape while rows finish (dead slots), so that its
        :class:`DecodeStep` can be a CUDA graph: when it decodes long enough to repay a capture."""
        if self.static_decode is not None:
            return self.static_decode
        return self.device.type == "cuda" and self.decode_graphs and steps >= GRAPH_MIN_STEPS

    def _decode_rows(
        self, rows: list[Row], live: list[int], logits: torch.Tensor, plan: PackedPlan
    ) -> None:
        """Sample every live row's tokens until each stops. Finished rows leave the batch; in a
        static decode (a CUDA graph) they stay as dead slots until half the batch is dead."""
        device = self.device
        index = torch.tensor(live, dtype=torch.long, device=device)
        logits = logits.index_select(0, index)
        sampling = RowSampling.of(
            [rows[i].request.sampling for i in live], [rows[i].seed for i in live], device
        )
        eos = torch.tensor(sorted(self._eos_ids), dtype=torch.long)
        max_new = torch.tensor([rows[i].max_new for i in live], dtype=torch.long)
        has_stop = [bool(rows[i].request.sampling.stop) for i in live]
        any_stop = any(has_stop)
        steps = int(max_new.max())
        tok_h = torch.zeros((len(live), steps), dtype=torch.long)
        lp_h = torch.zeros((len(live), steps), dtype=torch.float32)
        raw_h = torch.zeros((len(live), steps), dtype=torch.float32)
        batch = torch.arange(len(live))  # per slot of the batch: its row's position in ``live``
        dead = torch.zeros(len(live), dtype=torch.bool)  # slots whose row has finished
        static = self._static_decode(steps)
        graphs = static and device.type == "cuda" and self.decode_graphs
        state: DecodeState | None = None
        step_fn: DecodeStep | None = None
        step = 0
        while True:
            tokens, lp, raw = sample(logits, sampling, step)
            host = torch.stack([tokens.to(torch.float32), lp, raw]).cpu()
            tok_step = host[0].to(torch.long)
            alive = ~dead
            at = batch[alive]
            tok_h[at, step] = tok_step[alive]
            lp_h[at, step] = host[1][alive]
            raw_h[at, step] = host[2][alive]
            done = alive & (torch.isin(tok_step, eos) | (max_new[batch] <= step + 1))
            if any_stop:  # per step, per row in Python: only when a row has stop strings
                for j, (b, live_j) in enumerate(zip(batch.tolist(), alive.tolist(), strict=True)):
                    if live_j and has_stop[b]:
                        text = self._decode(tok_h[b, : step + 1].tolist())
                        done[j] |= rows[live[b]].hits_stop(text)
            for b in batch[done].tolist():
                rows[live[b]].finish(
                    tok_h[b, : step + 1],
                    lp_h[b],
                    raw_h[b],
                    eos_ids=self._eos_ids,
                    decode=self._decode,
                )
            dead |= done
            if bool(dead.all()):
                return
            if state is not None and static and int((~dead).sum()) > len(batch) // 2:
                keep = torch.arange(len(batch))  # dead slots ride along: the shape holds
            else:
                keep = (~dead).nonzero()[:, 0]
            if state is None:
                state = DecodeState.from_plan(
                    plan, [live[b] for b in batch[keep].tolist()], steps - 1, device
                )
                plan.captured = None  # the packed K/V is no longer needed
                sampling = sampling.select(keep.to(device))
            elif len(keep) < len(batch):
                keep_dev = keep.to(device)
                state.select(keep_dev)
                sampling = sampling.select(keep_dev)
                step_fn = None  # a new batch size: a new step (and graph)
            if len(keep) < len(batch):
                tokens = tokens.index_select(0, keep.to(device))
            batch, dead = batch[keep], dead[keep]
            step += 1
            self.counters["forward_tokens"] += len(batch)
            fresh = step_fn is None
            if step_fn is None:
                step_fn = DecodeStep(self._forward, state, graph=graphs)
            logits = step_fn(tokens)
            if fresh and step_fn.graph is not None:
                self.counters["decode_graphs"] += 1
            if graphs and not step_fn.use_graph:
                self.decode_graphs = graphs = False  # it failed once: not again
            state.advance()

    def _decode(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))
