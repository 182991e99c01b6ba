"""PyTorch + transformers training backend, for CPU and small GPUs.

The memory trap on CPU is the output layer: the Gemma 3 vocabulary has 262,144 entries, so full
fp32 logits of a batch of 8 × 192 tokens (and their log-softmax) take ≈12 GB. This backend only
projects the hidden states of *response* positions, in chunks, each chunk under activation
checkpointing: the forward keeps one chunk of logits alive at a time and the backward recomputes
it. The log-probs divide the logits by the rollout temperature, so they match what the engine
sampled from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from rl_core.backends.base import (
    BackendConfig,
    TrainingBackend,
    TrainItem,
    chunked_logprobs,
    lr_at,
    param_groups,
)
from rl_core.backends.precision import resolve_bf16


def micro_batches(items: list[TrainItem], max_tokens: int) -> list[list[int]]:
    """Split item indices into micro-batches whose padded size (count × longest) fits the budget.

    An item longer than the budget gets a micro-batch of its own (it cannot be split).
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, item in enumerate(items):
        n = len(item.tokens)
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    return batches


def _chunk_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = (hidden @ weight.t()).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    with torch.no_grad():
        probs = torch.exp(logits - lse.unsqueeze(-1))
        entropy = lse - (probs * logits).sum(-1)
    return logp, entropy


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    chunk_size: int = 256,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs (and entropies) of ``targets`` given ``hidden`` ``[N, H]``, ``chunk_size`` rows
    of full-vocabulary logits at a time (checkpointed when grad is on)."""
    return chunked_logprobs(
        _chunk_logprobs, hidden, weight, targets, temperature, softcap, chunk_size=chunk_size
    )


#: Elements per all-reduce bucket (fp32: 256 MB), so large models never need one flat copy.
_BUCKET_NUMEL = 64 * 1024 * 1024


def reduce_gradients(model: Any) -> None:
    """Sum gradients over the data-parallel group (no-op without one), as DDP would.

    The loss of every rank is already divided by the global token count, so the sum is the
    global gradient and every rank then takes the same optimizer step. One bucketed
    ``all_reduce`` per step, after all micro-batches: DDP's wrapper cannot be used because the
    chunked-logits forward calls the decoder and the output layer separately, and accumulating
    micro-batches would need its ``no_sync`` anyway. A rank without any in-loss token still
    joins, with zeros.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for i, p in enumerate(params):
        bucket.append(p.grad)
        size += p.grad.numel()
        if size >= _BUCKET_NUMEL or i == len(params) - 1:
            flat = torch._utils._flatten_dense_tensors(bucket)  # type: ignore[no-untyped-call]
            dist.all_reduce(flat)
            for g, synced in zip(
                bucket,
                torch._utils._unflatten_dense_tensors(flat, bucket),  # type: ignore[no-untyped-call]
                strict=True,
            ):
                g.copy_(synced)
            bucket, size = [], 0


def _load_causal_lm(path: str | Path, device: torch.device) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.to(device)


class TorchHFBackend(TrainingBackend):
    """AdamW on a transformers causal LM, fp32 master weights, optional bf16 autocast."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: BackendConfig,
        *,
        device: str = "cpu",
        load_reference: bool | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        #: bf16 autocast only where the device computes bf16 natively (see ``precision``).
        self.bf16, self.precision = resolve_bf16(cfg.bf16, self.device)
        torch.manual_seed(cfg.seed)
        self.model_path = str(model_path)
        self.model: Any = _load_causal_lm(self.model_path, self.device)
        self.model.config.use_cache = False
        # A KL coefficient of 0 needs no reference model (the original loads one for nothing).
        if load_reference is None:
            load_reference = cfg.loss.use_kl_loss and cfg.loss.kl_loss_coef != 0.0
        self.ref_model: Any = None
        if load_reference:
            self.ref_model = _load_causal_lm(self.model_path, self.device)
            self.ref_model.eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model.named_parameters(), cfg.weight_decay),  # norms, biases: 0
            lr=lr_at(cfg, 0),
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
        )
        self.step = 0
        self.offloaded = False
        self._host: Any = None  # HostOffloader, made at the first offload on a GPU
        softcap = getattr(self.model.config, "final_logit_softcapping", None)
        self._softcap: float | None = float(softcap) if softcap else None

    # --- forward ---------------------------------------------------------------------------------

    def _autocast(self) -> Any:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def _response_logprobs(
        self, model: Any, items: list[TrainItem]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(it.tokens) for it in items)
        ids = torch.zeros(len(items), longest, dtype=torch.long)
        attn = torch.zeros(len(items), longest, dtype=torch.long)
        rows, cols, targets = [], [], []
        for b, it in enumerate(items):
            n = len(it.tokens)
            ids[b, :n] = torch.tensor(it.tokens)
            attn[b, :n] = 1
            # position p predicts token p + 1: response tokens are predicted from start-1 .. n-2
            for p in range(it.response_start - 1, n - 1):
                rows.append(b)
                cols.append(p)
                targets.append(it.tokens[p + 1])
        ids, attn = ids.to(self.device), attn.to(self.device)
        with self._autocast():
            hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
            sel = hidden[torch.tensor(rows), torch.tensor(cols)]
            weight = model.get_output_embeddings().weight
            return token_logprobs(
                sel,
                weight,
                torch.tensor(targets, device=self.device),
                temperature=self.cfg.temperature,
                softcap=self._softcap,
                chunk_size=self.cfg.logprob_chunk_size,
            )

    def _micro_batches(self, items: list[TrainItem]) -> list[list[int]]:
        return micro_batches(items, self.cfg.max_tokens_per_micro_batch)

    # --- training (the step itself is ``TrainingBackend.train_step``) ----------------------------

    def _check_train_step(self, total_tokens: float | None) -> None:
        """Nothing to refuse: without ``total_tokens`` a rank normalises by its own tokens."""

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _sum_gradients(self) -> None:
        reduce_gradients(self.model)

    def _clip_gradients(self) -> float:
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_grad))

    def _optimizer_step(self) -> None:
        self.optimizer.step()

    # --- weights, memory, checkpoints -----------------------------------------------------------

    def export_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        # named_parameters lists a tied weight once (Gemma's lm_head is the embedding), which is
        # what an engine's load expects; a state_dict would name it twice.
        return {
            k: (v.detach().to(dtype) if dtype is not None else v.detach()).cpu().clone()
            for k, v in self.model.named_parameters()
        }

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's parameters in a fixed order (a tied weight once): the bucketed
        transfers' source. While offloaded they are the pinned host buffers, which a transfer
        reads as they are (no onload)."""
        return [(k, v.detach()) for k, v in self.model.named_parameters()]

    def offload_tensors(self) -> dict[str, torch.Tensor]:
        """Everything that lives on the device between steps: weights, gradients (if any), the
        optimizer's state, the reference model. Names are stable across steps, so the host
        buffers of one offload are the buffers of the next."""
        out: dict[str, torch.Tensor] = {}
        names = {id(p): n for n, p in self.model.named_parameters()}
        for n, p in self.model.named_parameters():
            out[f"param:{n}"] = p
            if p.grad is not None:
                out[f"grad:{n}"] = p.grad
        for p, state in self.optimizer.state.items():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    out[f"optim:{names.get(id(p), id(p))}:{k}"] = v
        if self.ref_model is not None:
            for n, p in self.ref_model.named_parameters():
                out[f"ref:{n}"] = p
        return out

    def _offloader(self) -> Any:
        if self._host is None:
            from genrm_serve import HostOffloader

            self._host = HostOffloader(self.offload_tensors)
        return self._host

    def offload(self) -> None:
        """Weights, grads and Adam state into pinned host buffers allocated once (on CUDA)."""
        if not self.offloaded:
            if self.device.type != "cpu":
                self._offloader().offload()
            self.offloaded = True

    def onload(self) -> None:
        if self.offloaded:
            if self.device.type != "cpu":
                self._offloader().onload()
            self.offloaded = False

    def last_move(self) -> dict[str, float]:
        """Seconds of the last offload / onload (empty on CPU, where nothing moves)."""
        return dict(self._host.last) if self._host is not None else {}

    def save(self, path: Path, extra: dict[str, Any]) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(tmp / "model")
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state()},
            tmp / "optimizer.pt",
        )
        (tmp / "state.json").write_text(json.dumps({"step": self.step, "extra": extra}, indent=1))
        if path.exists():
            import shutil

            shutil.rmtree(path)
        os.replace(tmp, path)

    def load(self, path: Path) -> dict[str, Any]:
        """Restore what :meth:`save` wrote. Refused while offloaded, as Megatron's is: Adam's
        state would be made on the host beside the offloaded weights and stay there at onload."""
        self._check_loaded()
        path = Path(path)
        if not (path / "state.json").is_file():
            raise FileNotFoundError(f"--load {path}: not a checkpoint (no state.json)")
        loaded = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32)
        self.model.load_state_dict(loaded.state_dict())
        del loaded
        # on the host: the RNG state must stay a CPU ByteTensor (on a GPU, loading it onto the
        # device made every resume fail); the optimizer moves its state to its parameters' device
        opt = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=False)
        self.optimizer.load_state_dict(opt["optimizer"])
        torch.set_rng_state(opt["rng"])
        state = json.loads((path / "state.json").read_text())
        self.step = int(state["step"])
        extra: dict[str, Any] = state["extra"]
        return extra
