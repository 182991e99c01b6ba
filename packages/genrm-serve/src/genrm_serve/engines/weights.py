"""Moving a model's tensors cheaply: pinned host buffers for sleep / offload, and flat buckets for
handing weights from a trainer to an engine on the device.

Why one module for both sides: the trainer (rl-core) packs buckets and the engine (this package)
unpacks them, so the wire format of a bucket — names, shapes, offsets into one flat tensor — has
one owner.

- :class:`HostOffloader` moves a set of named device tensors (weights, gradients, optimizer
  state) into host buffers that are allocated **once**, pinned (page-locked) on CUDA, and reused
  on every later offload: no fresh pageable copy per step. Copies are ``non_blocking`` and there
  is one ``synchronize`` per move; afterwards the device memory is given back to the driver
  (``torch.cuda.empty_cache``) so that the next role on the GPU can take it.
- :func:`plan_buckets` / :func:`pack_bucket` / :func:`unpack_bucket`: weights cast to one dtype
  (bf16 on GPU) and laid out back to back in flat buckets of at most ``bucket_bytes``, so a
  transfer moves few large tensors, and peak extra memory is one bucket, not a model copy.
- :func:`ipc_handle` / :func:`open_ipc_handle`: a CUDA tensor shared with another process on the
  same GPU (``torch.multiprocessing.reductions.reduce_tensor``), the way trainers hand weights to
  a colocated engine; the receiver maps it onto *its* device index (Ray shows each actor its GPU
  as device 0, whatever its index on the node).
- :class:`WeightBroadcastGroup`: a process group of its own (NCCL on GPUs, gloo on CPU) between
  trainer rank 0 and the rollout engines on other GPUs, one broadcast per bucket. It is built from
  a ``TCPStore`` rather than ``init_process_group`` because the engines are not members of the
  trainer's default group. An SGLang engine joins the same group from its schedulers
  (``init_weights_update_group``), so the group's store keys and the bytes on the wire follow
  SGLang's receiver (see the class).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from genrm_serve import limits

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "WEIGHT_GROUP_NAME",
    "BucketMeta",
    "HostOffloader",
    "TensorMeta",
    "WeightBroadcastGroup",
    "dtype_from_name",
    "ipc_handle",
    "open_ipc_handle",
    "pack_bucket",
    "plan_buckets",
    "unpack_bucket",
]

#: Largest flat bucket of one weight transfer (bytes): large enough that a transfer is a few
#: big copies, small enough that the extra memory it needs on the GPU stays small.
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype {name!r} is not a torch dtype")
    return dtype


# --- pinned host buffers ------------------------------------------------------------------------


@dataclass
class _Slab:
    """One host allocation holding several tensors of one dtype, back to back."""

    flat: torch.Tensor
    registered: bool = False


class HostOffloader:
    """Moves named tensors to host buffers allocated once and back to the device.

    ``tensors()`` is called at every move and returns ``{name: tensor}`` of what to move (the
    owner decides: parameters, gradients, optimizer state); only tensors on a non-CPU device move.
    Each tensor is moved by rebinding its ``.data`` (a parameter stays the same ``Parameter``
    object, an optimizer's state dict keeps its tensors), so nothing outside needs re-pointing.

    ``in_place()`` (optional) names tensors that others are views of — a flat buffer a model's
    parameters live in. Re-binding would leave the views on the old memory, so these are copied
    out and their storage resized to 0 instead; onload gives each its storage back and copies in,
    and every view is valid again. While offloaded, ``buffer(name)`` holds their values.

    Buffers: the first offload of a name allocates its slot in a slab (one allocation per dtype
    per new set of names), pinned with ``cudaHostRegister`` where CUDA is available — exact size,
    unlike the caching host allocator, which rounds every request up to a power of two. Later
    offloads of the same name reuse the same memory (``buffer(name)`` lets tests check it).
    """

    def __init__(
        self,
        tensors: Callable[[], Mapping[str, torch.Tensor]],
        *,
        in_place: Callable[[], Mapping[str, torch.Tensor]] | None = None,
        pin: bool | None = None,
        empty_cache: bool = True,
        include_cpu: bool = False,
    ) -> None:
        self._tensors = tensors
        self._in_place = in_place or dict
        #: name → bytes of the storage an in-place tensor had (what onload gives back)
        self._storage_bytes: dict[str, int] = {}
        #: also move tensors that are on the CPU already (tests of the buffer logic on CPU)
        self.include_cpu = include_cpu
        self.pin = torch.cuda.is_available() if pin is None else pin
        self.empty_cache = empty_cache
        self._buffers: dict[str, torch.Tensor] = {}
        self._slabs: list[_Slab] = []
        #: name → device the tensor came from (where onload puts it back)
        self._devices: dict[str, torch.device] = {}
        self.offloaded = False
        #: seconds and bytes of the last move, for the metrics
        self.last: dict[str, float] = {}

    def buffer(self, name: str) -> torch.Tensor:
        return self._buffers[name]

    @property
    def host_bytes(self) -> int:
        return sum(s.flat.numel() * s.flat.element_size() for s in self._slabs)

    def _allocate(self, new: dict[str, torch.Tensor]) -> None:
        by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
        for name, t in new.items():
            by_dtype.setdefault(t.dtype, []).append((name, t))
        for dtype, items in by_dtype.items():
            total = sum(t.numel() for _, t in items)
            flat = torch.empty(total, dtype=dtype)
            slab = _Slab(flat)
            if self.pin and total:
                nbytes = total * flat.element_size()
                err = torch.cuda.cudart().cudaHostRegister(  # type: ignore[no-untyped-call]
                    flat.data_ptr(), nbytes, 0
                )
                if int(err) != 0:
                    raise RuntimeError(f"cudaHostRegister of {nbytes} bytes failed: {err}")
                slab.registered = True
            self._slabs.append(slab)
            offset = 0
            for name, t in items:
                self._buffers[name] = flat[offset : offset + t.numel()].view(t.shape)
                offset += t.numel()

    def _on_device(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {n: t for n, t in tensors.items() if self.include_cpu or t.device.type != "cpu"}

    def _moving(self) -> dict[str, torch.Tensor]:
        return self._on_device(self._tensors())

    def reserve(self) -> None:
        """Allocate (and pin) the buffers of what would move now, moving nothing: the next
        offload is then a copy only. Names already reserved keep their buffers."""
        every = self._moving() | self._on_device(self._in_place())
        self._allocate({n: t for n, t in every.items() if n not in self._buffers})

    def offload(self) -> None:
        """Device → host buffers; device memory released."""
        if self.offloaded:
            return
        t0 = time.perf_counter()
        in_place = self._on_device(self._in_place())
        for name, t in in_place.items():
            if t.storage_offset() != 0 or not t.is_contiguous():
                raise RuntimeError(f"offload: in-place tensor {name} is not its whole storage")
        moving = self._moving() | in_place
        stale = [
            n
            for n, t in moving.items()
            if n in self._buffers
            and (self._buffers[n].shape != t.shape or self._buffers[n].dtype != t.dtype)
        ]
        if stale:
            raise RuntimeError(f"offload: tensors changed shape or dtype since the last: {stale}")
        self._allocate({n: t for n, t in moving.items() if n not in self._buffers})
        for name, t in moving.items():
            self._buffers[name].copy_(t.detach(), non_blocking=self.pin)
        if self.pin:
            torch.cuda.synchronize()
        for name, t in moving.items():
            if name in in_place:
                self._storage_bytes[name] = t.untyped_storage().nbytes()
                t.untyped_storage().resize_(0)
                continue
            self._devices[name] = t.device
            t.data = self._buffers[name]
        del moving, in_place
        if self.empty_cache and torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.offloaded = True
        self.last = {"offload_s": time.perf_counter() - t0}

    def onload(self) -> None:
        """Host buffers → fresh device tensors; the host buffers stay for the next offload."""
        if not self.offloaded:
            return
        t0 = time.perf_counter()
        for name, view_base in self._on_device(self._in_place()).items():
            view_base.untyped_storage().resize_(self._storage_bytes.pop(name))
            view_base.copy_(self._buffers[name], non_blocking=self.pin)
        current = self._tensors()
        for name, device in self._devices.items():
            t = current.get(name)
            if t is None:
                continue
            host = self._buffers[name]
            if t.data_ptr() != host.data_ptr():
                raise RuntimeError(f"onload: {name} was re-bound while offloaded")
            on_device = torch.empty_like(host, device=device)
            on_device.copy_(host, non_blocking=self.pin)
            t.data = on_device
        if self.pin:
            torch.cuda.synchronize()
        self.offloaded = False
        self.last = {"onload_s": time.perf_counter() - t0}

    def close(self) -> None:
        """Unpin and drop the host buffers (onload first if offloaded)."""
        self.onload()
        for slab in self._slabs:
            if slab.registered:
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                cudart.cudaHostUnregister(slab.flat.data_ptr())
        self._slabs.clear()
        self._buffers.clear()


# --- flat buckets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    #: elements into the bucket
    offset: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class BucketMeta:
    """Which tensors a flat bucket holds, where, in which dtype (plain data: pickles anywhere)."""

    dtype: str
    numel: int
    tensors: tuple[TensorMeta, ...] = field(default_factory=tuple)

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_from_name(self.dtype).itemsize


def plan_buckets(
    named: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    dtype: torch.dtype = torch.bfloat16,
) -> list[BucketMeta]:
    """Tensors in order, cut into buckets of at most ``bucket_bytes`` in ``dtype``.

    A tensor larger than a bucket gets a bucket of its own (tensors are never split).
    Deterministic from names and shapes, so every side computes the same plan.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    per = dtype.itemsize
    buckets: list[BucketMeta] = []
    current: list[TensorMeta] = []
    size = 0
    name_of = str(dtype).removeprefix("torch.")
    for name, t in named:
        n = t.numel()
        if current and (size + n) * per > bucket_bytes:
            buckets.append(BucketMeta(name_of, size, tuple(current)))
            current, size = [], 0
        current.append(TensorMeta(name, tuple(t.shape), size))
        size += n
    if current:
        buckets.append(BucketMeta(name_of, size, tuple(current)))
    return buckets


def pack_bucket(
    meta: BucketMeta,
    tensors: Mapping[str, torch.Tensor],
    *,
    device: torch.device | str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The bucket's tensors cast and copied into one flat tensor (on ``device``, default: the
    first tensor's)."""
    dtype = dtype_from_name(meta.dtype)
    if out is None:
        first = tensors[meta.tensors[0].name] if meta.tensors else None
        where = device if device is not None else (first.device if first is not None else "cpu")
        out = torch.empty(meta.numel, dtype=dtype, device=where)
    with torch.no_grad():
        for tm in meta.tensors:
            src = tensors[tm.name]
            if tuple(src.shape) != tm.shape:
                raise ValueError(
                    f"pack_bucket: {tm.name} has shape {tuple(src.shape)}, not {tm.shape}"
                )
            out[tm.offset : tm.offset + tm.numel].view(tm.shape).copy_(src.detach())
    return out


def unpack_bucket(flat: torch.Tensor, meta: BucketMeta) -> dict[str, torch.Tensor]:
    """Views into ``flat`` by name (no copy)."""
    if flat.numel() != meta.numel or str(flat.dtype).removeprefix("torch.") != meta.dtype:
        raise ValueError(
            f"unpack_bucket: got {flat.numel()} × {flat.dtype}, the bucket is "
            f"{meta.numel} × {meta.dtype}"
        )
    return {tm.name: flat[tm.offset : tm.offset + tm.numel].view(tm.shape) for tm in meta.tensors}


# --- CUDA IPC -----------------------------------------------------------------------------------

#: Position of the device index in ``rebuild_cuda_tensor``'s arguments (torch's reductions).
_IPC_DEVICE_ARG = 6


def ipc_handle(tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    """A picklable handle on a CUDA tensor for another process on the same GPU.

    The producer must keep ``tensor`` alive until every receiver has copied out of it.
    """
    if tensor.device.type != "cuda":
        raise ValueError(f"ipc_handle needs a CUDA tensor, got one on {tensor.device}")
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(tensor)  # type: ignore[no-untyped-call]
    shared = list(args)
    # The GPU by UUID, not by this process's index: the receiver may number GPUs otherwise
    # (an SGLang engine sees every GPU of the node); open_ipc_handle puts its own index here.
    shared[_IPC_DEVICE_ARG] = str(torch.cuda.get_device_properties(tensor.device).uuid)
    return rebuild, tuple(shared)


def open_ipc_handle(handle: tuple[Any, tuple[Any, ...]], device: int | None = None) -> torch.Tensor:
    """The tensor behind :func:`ipc_handle`'s handle, mapped onto this process's ``device``."""
    rebuild, args = handle
    patched = list(args)
    patched[_IPC_DEVICE_ARG] = torch.cuda.current_device() if device is None else device
    tensor: torch.Tensor = rebuild(*patched)
    return tensor


# --- a broadcast group across GPUs --------------------------------------------------------------

#: The weight group's name: SGLang's schedulers key their side of the group by it
#: (``init_weights_update_group(group_name=...)``), and :class:`WeightBroadcastGroup` prefixes
#: its store keys with it the same way, so trainer, hf engines and SGLang engines meet.
WEIGHT_GROUP_NAME = "genrm-weights"


def _group_store(store: Any, group_name: str, backend: str) -> Any:
    """``store`` under the prefixes an SGLang scheduler's side of the group uses.

    SGLang 0.5.17 (``utils/common.py`` ``init_custom_process_group``) wraps its TCP rendezvous
    store in ``PrefixStore(group_name)`` and creates the group with torch's
    ``distributed_c10d._new_process_group_helper``, which adds ``"{group_name}/"`` and then
    ``"{device}/"`` before the backend sees the store. NCCL's members swap their unique id through
    that store, so every member must use the same nesting, or the first broadcast waits out the
    timeout. We nest the public ``PrefixStore`` the same way rather than call the private helper
    (it also registers the group process-wide, once per name, which ranks on threads of one
    process — the CPU tests — cannot share).
    """
    import torch.distributed as dist

    device = "cuda" if backend == "nccl" else "cpu"
    prefixed = dist.PrefixStore(group_name, store)  # type: ignore[attr-defined]
    prefixed = dist.PrefixStore(f"{group_name}/", prefixed)  # type: ignore[attr-defined]
    return dist.PrefixStore(f"{device}/", prefixed)  # type: ignore[attr-defined]


class WeightBroadcastGroup:
    """Rank 0 (the trainer) broadcasts flat buckets to ranks 1.. (the engines).

    ``backend`` is ``"nccl"`` for tensors on GPUs and ``"gloo"`` on CPU (tests). Every member
    calls the constructor with the same address; rank 0 hosts the store.

    On the wire a bucket is its bytes (``uint8``): SGLang's receiver
    (``update_weights_from_distributed(..., load_format="flattened_bucket")``,
    ``model_runner_components/weight_updater.py`` on 0.5.17) allocates the bucket's tensors in
    order, concatenates them as bytes and receives one ``uint8`` broadcast. A bucket of one dtype
    laid out back to back (:func:`plan_buckets`) has exactly those bytes, so one sender serves hf
    and SGLang engines alike, and an hf engine receives the same way through this class.
    """

    def __init__(
        self,
        host: str,
        port: int,
        rank: int,
        world_size: int,
        *,
        backend: str = "nccl",
        timeout_s: float = limits.WEIGHT_GROUP_TIMEOUT_S,
        group_name: str = WEIGHT_GROUP_NAME,
    ) -> None:
        import torch.distributed as dist

        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self._store = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, world_size, rank == 0, timeout=timeout
        )
        store = _group_store(self._store, group_name, backend)
        if backend == "nccl":
            self.pg: Any = dist.ProcessGroupNCCL(store, rank, world_size)  # type: ignore[call-arg]
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's ``tensor`` (same numel and dtype everywhere),
        sent as its bytes (the class docstring says why)."""
        import torch.distributed as dist

        if not tensor.is_contiguous():
            raise ValueError("WeightBroadcastGroup.broadcast needs a contiguous tensor")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([tensor.view(-1).view(torch.uint8)], opts).wait()

    def close(self) -> None:
        self.pg = None
