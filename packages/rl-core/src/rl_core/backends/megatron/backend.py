"""``MegatronBackend``: the policy as a Megatron-core ``GPTModel``, behind ``TrainingBackend``.

What it does, and why it differs from the torch backend where it does:

* **Model**: built from the HF config (:mod:`.config`) with Megatron's local layer spec and
  torch SDPA as core attention (:mod:`.attention`), or Transformer Engine's spec with
  ``transformer_impl="transformer_engine"``; weights from the HF safetensors, this rank's TP
  shard (:mod:`.convert`). Parameters are fp32 master weights; ``bf16`` is autocast, as in the
  torch backend, so both train the same numbers.
* **Packing**: the samples of a micro-batch are concatenated into one row (THD, with
  ``cu_seqlens``): no padding, attention never crosses a sample boundary. Micro-batches hold at
  most ``max_tokens_per_micro_batch`` tokens (an item longer than that gets one of its own).
* **Log-probs**: only response positions are projected onto the vocabulary, in checkpointed
  chunks, divided by the rollout temperature; with TP > 1 the log-softmax is reduced over the
  vocabulary shards (:mod:`.logprobs`).
* **Loss**: ``rl_core.grpo.loss.grpo_loss``, token mean over the **global** batch: pass
  ``total_tokens`` (the in-loss response tokens over all data-parallel ranks) to
  :meth:`MegatronBackend.train_step`; gradients are then summed over the data-parallel group.
* **Optimizer**: Megatron's DDP and distributed optimizer: gradients reduce-scattered over data
  parallelism, torch AdamW on each rank's 1/DP shard, the parameters all-gathered back; no weight
  decay on norms and biases, the lr schedule of ``lr_at`` and gradient clipping by the global
  norm (TP shards counted once each, replicated weights once).

The process group: the trainer group initialises ``torch.distributed`` (one process per GPU);
standalone (tests, benchmarks) the backend starts a world of one itself and :meth:`close` ends
what it started.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from rl_core.backends.base import BackendConfig, TrainingBackend, TrainItem, lr_at
from rl_core.backends.megatron import require_megatron
from rl_core.backends.megatron.config import (
    MegatronModelArgs,
    check_tensor_parallel,
    gpt_model_kwargs,
    model_args_from_hf,
    transformer_config_kwargs,
)
from rl_core.backends.megatron.convert import hf_to_megatron, megatron_param_kinds, megatron_to_hf
from rl_core.backends.megatron.logprobs import vocab_parallel_token_logprobs
from rl_core.backends.megatron.parallel import MegatronConfig, check_parallel_sizes


def pack_micro_batches(items: list[TrainItem], max_tokens: int) -> list[list[int]]:
    """Item indices in order, grouped so each group's *summed* length fits ``max_tokens``
    (packed, so there is no padding to count); an oversized item gets a group of its own."""
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, item in enumerate(items):
        n = len(item.tokens)
        if current and used + n > max_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        batches.append(current)
    return batches


def load_hf_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of an HF checkpoint folder's safetensors files, on CPU."""
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files (an HF checkpoint folder?)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Gradients are summed in flat buckets of about this many bytes (few, large collectives).
_BUCKET_BYTES = 256 * 2**20


def _all_reduce_coalesced(tensors: list[torch.Tensor], group: Any) -> None:
    """Sum ``tensors`` in place over ``group``, flattened into buckets of one dtype."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    bucket: list[torch.Tensor] = []
    size = 0

    def flush() -> None:
        nonlocal bucket, size
        if bucket:
            flat = _flatten_dense_tensors(bucket)  # type: ignore[no-untyped-call]
            dist.all_reduce(flat, group=group)
            synced = _unflatten_dense_tensors(flat, bucket)  # type: ignore[no-untyped-call]
            for t, s in zip(bucket, synced, strict=True):
                t.copy_(s)
        bucket, size = [], 0

    for t in tensors:
        if bucket and (
            t.dtype != bucket[0].dtype or size + t.numel() * t.element_size() > _BUCKET_BYTES
        ):
            flush()
        bucket.append(t)
        size += t.numel() * t.element_size()
    flush()


class _CudaAsCpu(TorchFunctionMode):
    """Megatron's CUDA-only spellings, answered on the CPU: tensors made with
    ``device="cuda"`` are made on the CPU, ``.cuda()`` keeps a tensor where it is, and
    ``Tensor.type()`` names a CPU tensor by its CUDA kind (the distributed optimizer and its
    gradient clipping accept only ``torch.cuda.*Tensor``)."""

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        out = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return str(out).replace("torch.", "torch.cuda.", 1)
        return out


@contextlib.contextmanager
def _cpu_device_redirect(device: torch.device) -> Iterator[None]:
    """On CPU, let Megatron's code run as on a GPU: ``torch.cuda.current_device()`` (RoPE,
    DDP's buffers) answers "cpu", and :class:`_CudaAsCpu` covers the rest.

    Only while the backend itself runs Megatron code, and only without CUDA (so the tests run
    Megatron's own DDP and distributed optimizer over gloo); on a GPU this is a no-op.
    """
    if device.type != "cpu":
        yield
        return
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"), _CudaAsCpu():
        yield


def _packed_positions(lengths: list[int], device: torch.device) -> torch.Tensor:
    """Every token's position in its own sequence, for RoPE tables indexed by packed token.

    Given a table as long as the pack, Megatron's THD RoPE rotates the whole pack in one call
    (its per-sequence path splits the queries and keys, rotates and copies each piece back, in
    every layer); each sequence's slice of the table starts at position 0, as the per-sequence
    path would have it.
    """
    return torch.cat([torch.arange(n) for n in lengths]).to(device)


class MegatronBackend(TrainingBackend):
    """A Megatron-core GPT policy (plus, with a non-zero KL coefficient, its frozen reference).

    The TP peers of one data-parallel rank return the same :meth:`train_step` metrics.
    """

    def __init__(
        self,
        model_path: str | Path,
        cfg: BackendConfig,
        parallel: MegatronConfig | None = None,
        *,
        device: str = "cuda",
        load_reference: bool | None = None,
    ) -> None:
        require_megatron()
        from megatron.core import parallel_state as ps
        from transformers import AutoConfig

        self.cfg = cfg
        self.parallel = parallel or MegatronConfig()
        self.device = torch.device(device)
        #: ``--bf16`` unset (auto): bf16 on CUDA; on CPU Megatron's linear layers cannot (below)
        self.bf16 = self.device.type == "cuda" if cfg.bf16 is None else cfg.bf16
        self.precision = "bf16 autocast" if self.bf16 else "fp32"
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.model_path = str(model_path)
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        self.args: MegatronModelArgs = model_args_from_hf(self.hf_config)
        tp = self.parallel.tensor_model_parallel_size
        check_tensor_parallel(self.args, tp)
        self._fused_norms = self.parallel_impl == "transformer_engine"

        self._owns_process_group = not dist.is_initialized()
        if self._owns_process_group:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, rank=0, world_size=1)
        check_parallel_sizes(dist.get_world_size(), self.parallel)
        self._owns_model_parallel = not ps.model_parallel_is_initialized()
        if self._owns_model_parallel:
            ps.initialize_model_parallel(tp, self.parallel.pipeline_model_parallel_size)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.tp_size = tp
        self.dp_group = ps.get_data_parallel_group()
        self.dp_size = dist.get_world_size(self.dp_group)
        #: Which share of the global batch this rank trains on (TP peers share one).
        self.dp_rank = ps.get_data_parallel_rank()
        torch.manual_seed(cfg.seed)
        if self.device.type == "cuda":
            from megatron.core import tensor_parallel

            tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)

        hf_state = load_hf_state_dict(self.model_path)
        self.model = self._build_model(hf_state)
        if load_reference is None:
            load_reference = cfg.loss.use_kl_loss and cfg.loss.kl_loss_coef != 0.0
        self.ref_model: Any = None
        if load_reference:
            self.ref_model = self._build_model(hf_state)
            self.ref_model.eval().requires_grad_(False)
        del hf_state
        # Megatron's DDP and distributed optimizer, built at the first use (a train step, a
        # load): a forward-only rank never allocates grad buffers or optimizer state.
        self._ddp: Any = None
        self._optimizer: Any = None
        self.step = 0
        self.offloaded = False
        self._host: Any = None  # HostOffloader, made at the first offload on a GPU

    @property
    def parallel_impl(self) -> str:
        return self.parallel.transformer_impl

    # --- model -----------------------------------------------------------------------------------

    def _layer_spec(self) -> Any:
        from rl_core.backends.megatron.residual import promoting_bias_dropout_add

        if self.parallel_impl == "transformer_engine":
            from megatron.core.models.gpt.gpt_layer_specs import (
                get_gpt_layer_with_transformer_engine_spec,
            )

            spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=self.args.qk_layernorm)
        else:
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

            from rl_core.backends.megatron.attention import SDPACoreAttention
            from rl_core.backends.megatron.norms import HFRMSNorm

            spec = get_gpt_layer_local_spec(
                qk_layernorm=self.args.qk_layernorm, normalization="RMSNorm"
            )
            attention = spec.submodules.self_attention.submodules
            attention.core_attention = SDPACoreAttention
            if self.args.qk_layernorm:  # queries and keys enter RoPE in fp32 (see .norms)
                attention.q_layernorm = attention.k_layernorm = HFRMSNorm
        # the residual stream stays fp32 under autocast, as in transformers (see .residual)
        spec.submodules.self_attn_bda = promoting_bias_dropout_add
        spec.submodules.mlp_bda = promoting_bias_dropout_add
        return spec

    def _build_model(self, hf_state: dict[str, torch.Tensor]) -> Any:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(
            **transformer_config_kwargs(
                self.args,
                tensor_model_parallel_size=self.tp_size,
                pipeline_model_parallel_size=self.parallel.pipeline_model_parallel_size,
                sequence_parallel=self.parallel.sequence_parallel,
                use_cpu_initialization=True,
            )
        )
        with _cpu_device_redirect(self.device):
            model = GPTModel(config, self._layer_spec(), **gpt_model_kwargs(self.args))
        shard = hf_to_megatron(hf_state, self.args, self.tp_size, fused_norms=self._fused_norms)[
            self.tp_rank
        ]
        result = model.load_state_dict(shard, strict=False)
        missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            raise RuntimeError(
                f"HF → Megatron weights do not match the model: missing {missing}, "
                f"unexpected {result.unexpected_keys}"
            )
        return model.to(self.device)

    @property
    def optimizer(self) -> Any:
        """Megatron's distributed optimizer over this rank's model (built at the first use).

        The model is wrapped in Megatron's DDP first: parameters and gradients move into
        contiguous fp32 buffers; after the backward the gradients are reduce-scattered over the
        data-parallel group, each rank steps AdamW (torch's, Megatron's fallback without
        Transformer Engine or Apex) on its 1/DP shard of the buffer, and the updated parameters
        are all-gathered back. So the Adam state is split over data parallelism; at DP = 1 it is
        one torch AdamW over the whole model. Gradients are summed, not averaged, over ranks
        (``calculate_per_token_loss``): the loss is already divided by the global batch's tokens.
        No weight decay on norms and biases: Megatron's own rule, the torch backend's too.
        """
        if self._optimizer is None:
            from megatron.core.distributed import (
                DistributedDataParallel,
                DistributedDataParallelConfig,
            )
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

            cfg = self.cfg
            for name, p in self.model.named_parameters():
                # Megatron's grad norm counts a replicated weight once over TP by this attribute,
                # which only its weight initialisation sets (skipped: the weights come from HF)
                if megatron_param_kinds(name) != "replicated":
                    p.tensor_model_parallel = True
            with _cpu_device_redirect(self.device):
                self._ddp = DistributedDataParallel(
                    self.model.config,
                    DistributedDataParallelConfig(
                        grad_reduce_in_fp32=True, use_distributed_optimizer=True
                    ),
                    self.model,
                )
                self._optimizer = get_megatron_optimizer(
                    OptimizerConfig(
                        optimizer="adam",
                        lr=lr_at(cfg, 0),
                        weight_decay=cfg.weight_decay,
                        adam_beta1=cfg.adam_beta1,
                        adam_beta2=cfg.adam_beta2,
                        adam_eps=cfg.adam_eps,
                        clip_grad=cfg.clip_grad,
                        use_distributed_optimizer=True,
                        params_dtype=torch.float32,
                    ),
                    [self._ddp],
                )
        return self._optimizer

    def _set_lr(self, lr: float) -> None:
        """The step's lr and weight decay in every group (Megatron's multipliers: 0 wd for norms
        and biases); its scheduler is not used, ``lr_at`` is the schedule of both backends."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.cfg.weight_decay * group.get("wd_mult", 1.0)

    def _zero_grad(self) -> None:
        self._ddp.zero_grad_buffer()
        self.optimizer.zero_grad(set_to_none=True)

    def _output_weight(self, model: Any) -> torch.Tensor:
        if self.args.tie_word_embeddings:
            return model.embedding.word_embeddings.weight  # type: ignore[no-any-return]
        return model.output_layer.weight  # type: ignore[no-any-return]

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _response_logprobs(
        self, model: Any, items: list[TrainItem]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-response-token log-probs and entropies of ``items``, packed into one row."""
        from megatron.core import tensor_parallel
        from megatron.core.packed_seq_params import PackedSeqParams

        lengths = [len(it.tokens) for it in items]
        flat = [t for it in items for t in it.tokens]
        if self.parallel.sequence_parallel and len(flat) % self.tp_size:
            pad = self.tp_size - len(flat) % self.tp_size  # a dummy sequence: SP splits by TP
            flat += [0] * pad
            lengths.append(pad)
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        rows, targets = [], []
        for it, start in zip(items, cu.tolist(), strict=False):
            for p in range(it.response_start - 1, len(it.tokens) - 1):
                rows.append(start + p)
                targets.append(it.tokens[p + 1])
        # The local path (RoPE's THD split, our SDPA attention) reads the boundaries on the
        # host: a CPU tensor saves a device sync per layer. Transformer Engine's kernels need
        # them on the device.
        cu_seqlens = cu if self.parallel_impl == "local" else cu.to(self.device)
        packed = PackedSeqParams(
            qkv_format="thd",
            cu_seqlens_q=cu_seqlens,
            cu_seqlens_kv=cu_seqlens,
            max_seqlen_q=max(lengths),
            max_seqlen_kv=max(lengths),
        )
        ids = torch.tensor([flat], device=self.device)
        with _cpu_device_redirect(self.device), self._autocast():
            emb = model.embedding(input_ids=ids, position_ids=None)  # [t(/tp), 1, h]
            rope = model.rotary_pos_emb(max(lengths), packed_seq=True)
            if self.parallel_impl == "local":
                rope = rope[_packed_positions(lengths, rope.device)]
            hidden = model.decoder(
                hidden_states=emb,
                attention_mask=None,
                rotary_pos_emb=rope,
                packed_seq_params=packed,
            )
            if self.parallel.sequence_parallel:
                hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden)
            elif self.tp_size > 1:
                hidden = tensor_parallel.copy_to_tensor_model_parallel_region(hidden)
            sel = hidden[:, 0][torch.tensor(rows, device=self.device)]
            return vocab_parallel_token_logprobs(
                sel,
                self._output_weight(model),
                torch.tensor(targets, device=self.device),
                temperature=self.cfg.temperature,
                chunk_size=self.cfg.logprob_chunk_size,
                tp_group=self.tp_group,
                tp_rank=self.tp_rank,
            )

    def _micro_batches(self, items: list[TrainItem]) -> list[list[int]]:
        return pack_micro_batches(items, self.cfg.max_tokens_per_micro_batch)

    # --- training (the step itself is ``TrainingBackend.train_step``) ----------------------------

    def _check_train_step(self, total_tokens: float | None) -> None:
        """bf16 training needs CUDA; ``total_tokens`` (the in-loss response tokens of the whole
        global batch over all data-parallel ranks) may be left out only at data parallel 1."""
        if self.bf16 and self.device.type != "cuda":
            raise ValueError(
                "--bf16 training with --train-backend megatron needs CUDA: Megatron's linear "
                "layers re-enter autocast in their backward only on CUDA (use fp32 on CPU)"
            )
        if total_tokens is None and self.dp_size > 1:
            raise ValueError(
                f"train_step on {self.dp_size} data-parallel ranks needs total_tokens (the "
                "global batch's in-loss tokens), else each rank normalises by its own"
            )

    def _tp_partial(self, name: str, param: torch.Tensor) -> bool:
        """A replicated weight whose gradient each TP rank holds only a part of: q/k norms (each
        rank normalises its own heads) and, with sequence parallelism, the norms (each rank sees
        its slice of the sequence). Megatron sums these over TP (finalize_model_grads)."""
        if self.tp_size == 1:
            return False
        if self.args.qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name):
            return True
        return self.parallel.sequence_parallel and bool(getattr(param, "sequence_parallel", False))

    def _sum_gradients(self) -> None:
        """Nothing here: Megatron's DDP reduce-scatters in :meth:`_clip_gradients`, only on a
        step that trains (the same on every rank)."""

    def _clip_gradients(self) -> float:
        """Sum partial replicated gradients over TP, reduce-scatter all of them over data
        parallel, then clip this rank's shard by the global norm (Megatron's, every shard and
        TP-sharded weight counted once); returns the norm before clipping."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        partial = [p.main_grad for n, p in self.model.named_parameters() if self._tp_partial(n, p)]
        if partial:
            _all_reduce_coalesced(partial, self.tp_group)
        with _cpu_device_redirect(self.device):
            self._ddp.finish_grad_sync()
            self.optimizer.prepare_grads()  # the shard's gradients onto its main parameters
            norm = float(self.optimizer.get_grad_norm())
            if math.isfinite(norm):
                params = self.optimizer.get_parameters()
                clip_grad_by_total_norm_fp32(params, self.cfg.clip_grad, norm)
        return norm

    def _optimizer_step(self) -> None:
        with _cpu_device_redirect(self.device):
            self.optimizer.step_with_ready_grads()  # + the all-gather of the parameters

    # --- weights, memory, checkpoints -----------------------------------------------------------

    def _megatron_shards(self, *, on_host: bool = True) -> list[dict[str, torch.Tensor]]:
        """Every TP rank's Megatron state (all-gathered), as CPU tensors unless ``on_host`` is
        False (then where the weights are: the device, or the host buffers while offloaded)."""

        def out(t: torch.Tensor) -> torch.Tensor:
            return t.cpu() if on_host else t

        local = self._local_params()
        if self.tp_size == 1:
            return [{k: out(v) for k, v in local.items()}]
        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.tp_size)]
        for name, value in local.items():
            if megatron_param_kinds(name) == "replicated":
                for s in shards:
                    s[name] = out(value)
                continue
            parts = [torch.empty_like(value) for _ in range(self.tp_size)]
            dist.all_gather(parts, value.contiguous(), group=self.tp_group)
            for s, part in zip(shards, parts, strict=True):
                s[name] = out(part)
        return shards

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy's full weights under HF names (tied embeddings named once)."""
        hf = megatron_to_hf(self._megatron_shards(), self.args, fused_norms=self._fused_norms)
        return {k: (v.to(dtype) if dtype is not None else v).clone() for k, v in hf.items()}

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The policy under HF names where it lives (the device; the host buffers while
        offloaded): the bucketed transfers' source, as the engines' models name their weights.
        The fused projections are split anew on each call, so a sync sees the current weights:
        without TP everything is a view of the parameters except q / k / v (their split is not
        contiguous: copies of the attention weights). With TP every rank must call it (it
        all-gathers the shards); a sync calls it once (``TrainWorker.weight_buckets``)."""
        hf = megatron_to_hf(
            self._megatron_shards(on_host=False), self.args, fused_norms=self._fused_norms
        )
        return list(hf.items())

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Copy full HF-named weights (another policy's :meth:`export_weights`) into this rank's
        shard: a forward-only rank (``actor_fwd``) following the policy after a weight sync."""
        shard = hf_to_megatron(state, self.args, self.tp_size, fused_norms=self._fused_norms)[
            self.tp_rank
        ]
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for k, v in shard.items():
                own[k].copy_(v.to(own[k].device, own[k].dtype))

    def _buffers(self) -> list[Any]:
        """Megatron DDP's contiguous parameter-and-gradient buffers (none before the first use)."""
        if self._ddp is None:
            return []
        return list(self._ddp.buffers) + list(self._ddp.expert_parallel_buffers)

    def offload_tensors(self) -> dict[str, torch.Tensor]:
        """What an offload re-binds to host memory: the Adam state of this rank's shard, the
        reference model, and the policy's own weights while DDP does not hold them yet (a
        forward-only rank). Names are stable across steps: each offload reuses the buffers."""
        out: dict[str, torch.Tensor] = {}
        if self._optimizer is not None:
            inner = self._optimizer.optimizer
            for g, group in enumerate(inner.param_groups):
                for i, p in enumerate(group["params"]):
                    for k, v in inner.state.get(p, {}).items():
                        if isinstance(v, torch.Tensor) and v.dim() > 0:
                            out[f"adam:{g}.{i}:{k}"] = v
        for prefix, model in (
            ("ref", self.ref_model),
            ("policy", self.model if self._ddp is None else None),
        ):
            if model is not None:
                out |= {f"{prefix}:{n}": p for n, p in model.named_parameters()}
        return out

    def offload_views(self) -> dict[str, torch.Tensor]:
        """DDP's contiguous parameter buffers: every parameter and optimizer shard is a view
        of one, so an offload frees their storage in place (see ``HostOffloader``)."""
        return {f"ddp:{i}": buf.param_data for i, buf in enumerate(self._buffers())}

    def offload(self) -> None:
        """Everything on the accelerator to pinned host buffers (allocated once, reused) by
        ``genrm_serve.HostOffloader``; DDP's gradient buffers are freed (zero between steps).
        While offloaded, a checkpoint or a weight sync reads the host copies."""
        if self.offloaded:
            return
        if self.device.type != "cpu":
            if self._host is None:
                from genrm_serve import HostOffloader

                self._host = HostOffloader(self.offload_tensors, in_place=self.offload_views)
            self._host.offload()
            if self._ddp is not None:
                self._ddp.offload_grad_buffers(synchronize=False)
        self.offloaded = True

    def onload(self) -> None:
        if not self.offloaded:
            return
        if self.device.type != "cpu":
            if self._ddp is not None:
                self._ddp.restore_grad_buffers()
            self._host.onload()
        self.offloaded = False

    def last_move(self) -> dict[str, float]:
        """Seconds of the last offload / onload (empty on CPU, where nothing moves)."""
        return dict(self._host.last) if self._host is not None else {}

    def _local_params(self) -> dict[str, torch.Tensor]:
        """This rank's Megatron parameters where they are now: the device, or (offloaded) their
        place in the host copy of their DDP buffer."""
        local = {k: v.detach() for k, v in self.model.named_parameters()}
        if not (self.offloaded and self._buffers()):
            return local
        where = {}
        for i, buf in enumerate(self._buffers()):
            host = self._host.buffer(f"ddp:{i}")
            for param, (start, end, _) in buf.param_index_map.items():
                where[id(param)] = host[start:end]
        return {k: where[id(p)].view(p.shape) for k, p in self.model.named_parameters()}

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        """An HF folder (``model/``: safetensors + config, loads in transformers), the step and
        ``extra``, and each rank's shard of the optimizer (``optimizer_tpNN_dpMM.pt``: the Adam
        state of its part of the distributed optimizer).

        Collective: every rank calls it (the weights are gathered over TP, every rank writes its
        own optimizer shard; global rank 0 writes the rest). Works offloaded too: it reads the
        host copies then.
        """
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        writer = dist.get_rank() == 0
        hf = self.export_weights() if writer or self.tp_size > 1 else {}  # TP: collective
        if writer:
            self._write(tmp, hf, extra)
        dist.barrier()
        torch.save(
            {
                "optimizer": None
                if self._optimizer is None
                else self._optimizer.optimizer.state_dict(),
                "rng": torch.get_rng_state(),
            },
            tmp / self._optimizer_file(),
        )
        dist.barrier()
        if writer:
            self._publish(tmp, path)
        dist.barrier()

    def _optimizer_file(self) -> str:
        return f"optimizer_tp{self.tp_rank:02d}_dp{self.dp_rank:02d}.pt"

    def _write(self, tmp: Path, hf: dict[str, torch.Tensor], extra: dict[str, Any]) -> None:
        from safetensors.torch import save_file

        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "model").mkdir(parents=True)
        save_file(
            {k: v.contiguous() for k, v in hf.items()}, str(tmp / "model" / "model.safetensors")
        )
        self.hf_config.save_pretrained(tmp / "model")
        state = {"step": self.step, "extra": extra, "tp": self.tp_size, "dp": self.dp_size}
        (tmp / "state.json").write_text(json.dumps(state, indent=1))

    @staticmethod
    def _publish(tmp: Path, path: Path) -> None:
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore what :meth:`save` wrote; every rank calls it (each reads its TP shard of the
        weights and its own optimizer shard: the same TP and DP sizes as the save)."""
        self._check_loaded()
        path = Path(path)
        if not (path / "state.json").is_file():
            raise FileNotFoundError(f"--load {path}: not a checkpoint (no state.json)")
        state = json.loads((path / "state.json").read_text())
        if "tp" not in state or "dp" not in state:
            raise ValueError(
                f"--load {path}: state.json has no 'tp' / 'dp' (written before the Megatron "
                "backend sharded its optimizer): its optimizer state cannot be placed"
            )
        saved = (state["tp"], state["dp"])
        if saved != (self.tp_size, self.dp_size):
            raise ValueError(
                f"--load {path}: saved at tensor parallel {saved[0]} × data parallel {saved[1]}, "
                f"this run is --tensor-model-parallel-size {self.tp_size} × data parallel "
                f"{self.dp_size} (actor GPUs / TP): the optimizer shards need the same sizes"
            )
        opt_file = path / self._optimizer_file()
        shard = hf_to_megatron(
            load_hf_state_dict(path / "model"),
            self.args,
            self.tp_size,
            fused_norms=self._fused_norms,
        )[self.tp_rank]
        with torch.no_grad():
            own = dict(self.model.named_parameters())
            for k, v in shard.items():
                own[k].copy_(v)
        opt = torch.load(opt_file, map_location="cpu", weights_only=False)
        if opt["optimizer"] is not None:
            self.optimizer.optimizer.load_state_dict(opt["optimizer"])
        torch.set_rng_state(opt["rng"])
        self.step = int(state["step"])
        extra: dict[str, Any] = state["extra"]
        return extra

    def close(self) -> None:
        """End the model-parallel state and process group this backend started (if any)."""
        from megatron.core import parallel_state as ps

        if self._owns_model_parallel and ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if self._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_model_parallel = self._owns_process_group = False
