"""The bucket plan every weight transport shares: the one dtype table (proto `DType` ↔
torch name, float8 included), `TensorSpec`s of a state dict, and packing tensors into flat
byte buckets.

Both sides meet on a *bucket plan*: the ordered list of `(name, shape, dtype)` is packed
greedily into flat byte buckets of at most `bucket_bytes` (a tensor larger than that gets
a bucket of its own). The plan is a pure function of the tensor list and the bucket size,
so sender and receivers derive it independently and only the list travels over gRPC
(`UpdateWeightsRequest.tensors`). One broadcast per bucket keeps the number of
collectives small and memory bounded.

Torch is imported lazily: a process that only needs the plan does not load it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlfleet_proto.v1 import common_pb2

if TYPE_CHECKING:
    import torch

DEFAULT_BUCKET_BYTES = 256 << 20
"""Large enough that per-collective latency is amortised, small enough to bound the
receiver's extra memory (slime uses 512 MB buckets for 30B models)."""

_DTYPE_NAMES: dict[int, str] = {
    common_pb2.DTYPE_FLOAT32: "float32",
    common_pb2.DTYPE_BFLOAT16: "bfloat16",
    common_pb2.DTYPE_FLOAT16: "float16",
    common_pb2.DTYPE_FLOAT64: "float64",
    common_pb2.DTYPE_INT64: "int64",
    common_pb2.DTYPE_INT32: "int32",
    common_pb2.DTYPE_UINT8: "uint8",
    common_pb2.DTYPE_FLOAT8_E4M3: "float8_e4m3fn",
}
_DTYPE_SIZES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
    "float8_e4m3fn": 1,
}
_NAME_TO_DTYPE: dict[str, int] = {name: enum for enum, name in _DTYPE_NAMES.items()}


def dtype_name(dtype: int) -> str:
    """torch dtype name ("bfloat16") of a proto `DType`; ValueError when unspecified."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype}") from None


def proto_dtype(torch_dtype: Any) -> int:
    """Proto `DType` of a torch dtype (or its name)."""
    name = str(torch_dtype).removeprefix("torch.")
    try:
        return _NAME_TO_DTYPE[name]
    except KeyError:
        raise ValueError(f"dtype {name} cannot travel as weights") from None


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor sits in its bucket."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    slots: tuple[TensorSlot, ...]
    nbytes: int


@dataclass(frozen=True)
class BucketPlan:
    buckets: tuple[Bucket, ...]
    total_bytes: int
    names: tuple[str, ...] = field(default=())
    bucket_bytes: int = 0
    """The size limit the plan was made with (re-planning with it gives the same plan)."""


def tensor_nbytes(shape: Sequence[int], dtype: str) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * _DTYPE_SIZES[dtype]


def plan_buckets(specs: Sequence[common_pb2.TensorSpec], bucket_bytes: int) -> BucketPlan:
    """Pack `specs` in order into buckets of at most `bucket_bytes` (see module doc).

    Offsets are aligned to 8 bytes: a bucket is one uint8 buffer viewed as each dtype,
    and an unaligned view of float64/int64 would be illegal.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes ({bucket_bytes}) must be > 0")
    buckets: list[Bucket] = []
    current: list[TensorSlot] = []
    used = 0
    total = 0
    for spec in specs:
        dtype = dtype_name(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
        nbytes = tensor_nbytes(shape, dtype)
        offset = (used + 7) // 8 * 8
        if current and offset + nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(current), used))
            current, offset = [], 0
        current.append(TensorSlot(spec.name, shape, dtype, offset, nbytes))
        used = offset + nbytes
        total += nbytes
    if current:
        buckets.append(Bucket(tuple(current), used))
    return BucketPlan(tuple(buckets), total, tuple(s.name for s in specs), bucket_bytes)


def specs_of(state_dict: Mapping[str, torch.Tensor]) -> list[common_pb2.TensorSpec]:
    """TensorSpecs of a state dict, in its order (the send order)."""
    return [
        common_pb2.TensorSpec(
            name=name,
            shape=list(t.shape),
            dtype=proto_dtype(t.dtype),  # type: ignore[arg-type]
        )
        for name, t in state_dict.items()
    ]


def tensor_spec(name: str, tensor: torch.Tensor) -> common_pb2.TensorSpec:
    """The spec of one tensor; ValueError naming it when its dtype cannot travel."""
    try:
        dtype = proto_dtype(tensor.dtype)
    except ValueError:
        raise ValueError(f"{name}: dtype {tensor.dtype} cannot travel on the wire") from None
    return common_pb2.TensorSpec(name=name, shape=list(tensor.shape), dtype=dtype)  # type: ignore[arg-type]


def pack_bucket(
    bucket: Bucket, tensors: Mapping[str, torch.Tensor], device: Any = None, out: Any = None
) -> Any:
    """One flat uint8 tensor holding the bucket's tensors at their offsets.

    `out` (uint8, at least `bucket.nbytes`): pack into it instead of a fresh buffer (a
    reused buffer costs no page faults; a fresh one above malloc's mmap threshold does,
    every time). Without alignment gaps the bucket is one concatenation instead of a
    copy per tensor.
    """
    import numpy
    import torch

    if out is None:
        flat = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
    elif out.numel() < bucket.nbytes or out.dtype != torch.uint8:
        raise ValueError(f"out: {out.numel()} {out.dtype} < bucket's {bucket.nbytes} uint8")
    else:
        flat = out[: bucket.nbytes]
    sources = [
        tensors[slot.name].detach().reshape(-1).view(torch.uint8)
        if tensors[slot.name].is_contiguous()
        else tensors[slot.name].detach().contiguous().reshape(-1).view(torch.uint8)
        for slot in bucket.slots
    ]
    if flat.device.type == "cpu" and all(s.device.type == "cpu" for s in sources):
        # Plain memcpy through numpy, off torch's intra-op pool: a parallel torch copy
        # waits at a barrier for every pool thread, and on a busy 2-core host that wait
        # cost ~40 ms per bucket (measured: 80 ms to pack 1.7 MB with 2 threads, 0.4 ms
        # with 1). A memory-bound copy gains nothing from more threads here.
        out_np = flat.numpy()
        if _gapless(bucket):
            numpy.concatenate([s.numpy() for s in sources], out=out_np)
        else:
            for slot, src in zip(bucket.slots, sources, strict=True):
                out_np[slot.offset : slot.offset + slot.nbytes] = src.numpy()
        return flat
    if _gapless(bucket) and all(s.device == flat.device for s in sources):
        torch.cat(sources, out=flat)
        return flat
    for slot, src in zip(bucket.slots, sources, strict=True):
        flat[slot.offset : slot.offset + slot.nbytes].copy_(src)
    return flat


def copy_into(target: Any, source: Any) -> None:
    """`target.copy_(source)`; between contiguous CPU tensors of one dtype, a numpy memcpy
    (see pack_bucket: no intra-op pool barrier)."""
    import numpy
    import torch

    if (
        target.device.type == "cpu"
        and source.device.type == "cpu"
        and target.dtype == source.dtype
        and target.shape == source.shape
        and target.is_contiguous()
        and source.is_contiguous()
        and target.numel() > 0
    ):
        dst = target.detach().reshape(-1).view(torch.uint8).numpy()
        numpy.copyto(dst, source.detach().reshape(-1).view(torch.uint8).numpy())
    else:
        target.copy_(source)


def _gapless(bucket: Bucket) -> bool:
    """True when the bucket's slots follow each other with no alignment padding."""
    end = 0
    for slot in bucket.slots:
        if slot.offset != end:
            return False
        end += slot.nbytes
    return end == bucket.nbytes


def unpack_bucket(bucket: Bucket, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views into `flat`, one per tensor (no copy; clone if `flat` is reused)."""
    import torch

    out = []
    for slot in bucket.slots:
        dtype = getattr(torch, slot.dtype)
        view = flat[slot.offset : slot.offset + slot.nbytes].view(dtype).view(slot.shape)
        out.append((slot.name, view))
    return out


def staging_buffer(buffers: list[Any], slot: int, nbytes: int, device: Any) -> Any:
    """`buffers[slot]`, grown to at least `nbytes` when needed; its first `nbytes`."""
    import torch

    current = buffers[slot]
    if current is None or current.numel() < nbytes:
        current = torch.empty(nbytes, dtype=torch.uint8, device=device)
        buffers[slot] = current
    return current[:nbytes]


def direct_view(bucket: Bucket, tensors: Mapping[str, Any], device: Any) -> Any:
    """The bucket as a uint8 view of the memory its tensors already occupy, when they lie
    in one storage at exactly the plan's offsets (a lone contiguous tensor; a packed
    bucket after `home_buckets`) on the group's device; None otherwise (pack/unpack).

    A packed bucket qualifies only when the storage holds nothing but the bucket or the
    slots leave no gap: a receive writes the whole range, padding included.
    """
    import torch

    first = tensors.get(bucket.slots[0].name)
    if first is None or first.device != torch.device(device) or bucket.nbytes == 0:
        return None
    storage = first.untyped_storage()
    base = first.data_ptr() - bucket.slots[0].offset
    for slot in bucket.slots:
        tensor = tensors.get(slot.name)
        if (
            tensor is None
            or not tensor.is_contiguous()
            or str(tensor.dtype).removeprefix("torch.") != slot.dtype
            or tuple(tensor.shape) != slot.shape
            or tensor.data_ptr() != base + slot.offset
            or tensor.untyped_storage().data_ptr() != storage.data_ptr()
        ):
            return None
    start = base - storage.data_ptr()
    if start < 0 or start + bucket.nbytes > storage.nbytes():
        return None
    if len(bucket.slots) > 1 and not (
        _gapless(bucket) or (start == 0 and storage.nbytes() == bucket.nbytes)
    ):
        return None
    flat = torch.empty(0, dtype=torch.uint8, device=first.device)
    flat.set_(storage, start, (bucket.nbytes,))  # type: ignore[call-overload]
    return flat


def home_buckets(plan: BucketPlan, targets: Mapping[str, torch.Tensor]) -> int:
    """Move the tensors of each packed bucket of `plan` into one flat buffer laid out as
    the bucket (`param.data = view`; module references stay valid), so that later
    receives land straight in the model, with no staging buffer or unpack copy.

    Skips a bucket whose targets are missing, of another dtype/shape, shared with
    another slot of the plan (tied weights), views into a larger storage (a fused
    parameter: moving the view would cut it loose) or mixed across devices. Returns the number
    of buckets homed. Call it with the model quiescent (under the engine's model lock).
    """
    import torch

    seen: dict[int, int] = {}
    for name in plan.names:
        tensor = targets.get(name)
        if tensor is not None:
            key = tensor.untyped_storage().data_ptr()
            seen[key] = seen.get(key, 0) + 1
    homed = 0
    with torch.no_grad():
        for bucket in plan.buckets:
            if len(bucket.slots) < 2:
                continue
            group = [targets.get(slot.name) for slot in bucket.slots]
            device = group[0].device if group[0] is not None else "cpu"
            if direct_view(bucket, targets, device) is not None:
                continue  # already in place
            if any(
                t is None
                or str(t.dtype).removeprefix("torch.") != slot.dtype
                or tuple(t.shape) != slot.shape
                or t.device != group[0].device  # type: ignore[union-attr]
                or seen.get(t.untyped_storage().data_ptr(), 0) != 1
                or not _owns_storage(t)
                for t, slot in zip(group, bucket.slots, strict=True)
            ):
                continue
            flat = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=group[0].device)  # type: ignore[union-attr]
            for tensor, slot in zip(group, bucket.slots, strict=True):
                assert tensor is not None
                view = flat[slot.offset : slot.offset + slot.nbytes]
                view = view.view(getattr(torch, slot.dtype)).view(slot.shape)
                copy_into(view, tensor)
                tensor.data = view
            homed += 1
    return homed


def _owns_storage(tensor: Any) -> bool:
    nbytes = tensor.numel() * tensor.element_size()
    return bool(
        tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == nbytes
        and tensor.is_contiguous()
    )
