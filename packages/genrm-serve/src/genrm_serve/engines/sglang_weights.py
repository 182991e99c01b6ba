"""A trainer's flat weight bucket handed to SGLang's scheduler without a copy on the way.

The trainer shares a bucket through CUDA IPC (:func:`genrm_serve.engines.weights.ipc_handle`:
torch's ``rebuild_cuda_tensor`` and its arguments, the device given by UUID). SGLang's
``update_weights_from_tensor(..., load_format="flattened_bucket")`` takes, per TP rank, a
pickled ``{"flattened_tensor", "metadata"}`` that its scheduler unpickles with torch's
reductions patched to accept a device UUID (``utils/patch_torch.py``), then views each named
tensor out of the flat one (``weight_sync/tensor_bucket.py``, seen on 0.5.17). So this engine
actor never opens the handle: it re-pickles it as the ``flattened_tensor``, and the scheduler
maps the trainer's memory directly. The alternative, opening it here and letting SGLang share
it again, fails: torch cannot re-export memory it imported through IPC.
"""

from __future__ import annotations

import io
from typing import Any

from genrm_serve.engines.weights import BucketMeta, dtype_from_name

__all__ = ["flattened_bucket_payload"]


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
