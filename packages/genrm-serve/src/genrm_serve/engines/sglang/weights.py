"""A trainer's flat weight buckets as SGLang's scheduler takes them: through CUDA IPC without a
copy on the way, or received from the weight-broadcast group.

The trainer shares a bucket through CUDA IPC (:func:`genrm_serve.engines.weights.ipc_handle`:
torch's ``rebuild_cuda_tensor`` and its arguments, the device given by UUID). SGLang's
``update_weights_from_tensor(..., load_format="flattened_bucket")`` takes, per TP rank, a
pickled ``{"flattened_tensor", "metadata"}`` that its scheduler unpickles with torch's
reductions patched to accept a device UUID (``utils/patch_torch.py``), then views each named
tensor out of the flat one (``weight_sync/tensor_bucket.py``, seen on 0.5.17). So this engine
actor never opens the handle: it re-pickles it as the ``flattened_tensor``, and the scheduler
maps the trainer's memory directly. The alternative, opening it here and letting SGLang share
it again, fails: torch cannot re-export memory it imported through IPC.

Across GPUs (:func:`distributed_bucket_request`), SGLang's schedulers are members of the
trainer's weight group (``WeightBroadcastGroup``) from ``init_weights_update_group``: rank
``rank_offset + tp_rank``, so an engine of TP size ``t`` takes ``t`` consecutive ranks, and every
TP rank receives the whole bucket (each loads its own shard of it).
``update_weights_from_distributed``
with ``load_format="flattened_bucket"`` allocates the named tensors in order, receives their
concatenated bytes in ONE ``uint8`` broadcast from rank 0 and loads them
(``model_runner_components/weight_updater.py`` ``_update_bucketed_weights_from_distributed``,
0.5.17); without that load format it takes one broadcast per tensor instead, which our sender
does not do. A failure answers ``(False, message)`` with the model partly updated.
"""

from __future__ import annotations

import io
from typing import Any

from genrm_serve.engines.weights import BucketMeta, dtype_from_name

__all__ = ["distributed_bucket_request", "flattened_bucket_payload"]


class _SharedCudaTensor:
    """Unpickles as the trainer's tensor, by torch's own rebuild function (as the receiving
    process has it: SGLang patches it there before unpickling)."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        from torch.multiprocessing import reductions

        return reductions.rebuild_cuda_tensor, self.args


def flattened_bucket_payload(meta: BucketMeta, handle: tuple[Any, tuple[Any, ...]]) -> bytes:
    """One TP rank's ``serialized_named_tensors`` entry: the bucket ``meta`` behind ``handle``."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    dtype = dtype_from_name(meta.dtype)
    metadata = [
        FlattenedTensorMetadata(
            name=t.name,
            shape=torch.Size(t.shape),
            dtype=dtype,
            start_idx=t.offset,
            end_idx=t.offset + t.numel,
            numel=t.numel,
        )
        for t in meta.tensors
    ]
    _, args = handle
    buf = io.BytesIO()
    ForkingPickler(buf).dump(
        {"flattened_tensor": _SharedCudaTensor(tuple(args)), "metadata": metadata}
    )
    return buf.getvalue()


def distributed_bucket_request(
    meta: BucketMeta, group_name: str, *, flush_cache: bool
) -> dict[str, Any]:
    """``Engine.update_weights_from_distributed`` keyword arguments that receive bucket ``meta``
    as the one broadcast the trainer sends for it (the module docstring says how it matches)."""
    return {
        "names": [t.name for t in meta.tensors],
        "dtypes": [meta.dtype] * len(meta.tensors),
        "shapes": [list(t.shape) for t in meta.tensors],
        "group_name": group_name,
        "flush_cache": flush_cache,
        "load_format": "flattened_bucket",
    }
