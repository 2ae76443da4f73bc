"""Choose a weight transport once: the trainer from its config string
(`services.weight_transport`), the rollout from the proto `WeightTransport` of a request.

Kinds: `grpc_stream` (chunks of a StreamWeights call), `shared_file` (a safetensors file
in a folder both sides read), `gloo` / `nccl` (a broadcast over a process group of its
own). Only this module maps names and enum values to classes; everything else holds a
`WeightSender`, `WeightReceiver` or `GroupReceiver`. A new transport is one module with
its sender and receiver plus its entries here. vLLM's native weight transfer
(`vllm.distributed.weight_transfer`) would be such a module: a sender that drives vLLM's
own engine-side receiver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfleet_proto.v1 import rollout_pb2

from rlfleet_weights.base import GroupReceiver, WeightReceiver, WeightRequestError, WeightSender

SENDER_KINDS = ("grpc_stream", "shared_file", "gloo", "nccl")
RECEIVER_KINDS = ("grpc_stream", "shared_file", "gloo", "nccl")
GROUP_KINDS = ("gloo", "nccl")
"""Kinds whose rollout joins a weight group (`InitWeightTransfer`)."""
STREAM_KINDS = ("grpc_stream",)
"""Kinds whose updates come by `StreamWeights`; the others come by `UpdateWeights`."""

_KINDS: dict[int, str] = {
    rollout_pb2.WEIGHT_TRANSPORT_GRPC_STREAM: "grpc_stream",
    rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE: "shared_file",
    rollout_pb2.WEIGHT_TRANSPORT_GLOO: "gloo",
    rollout_pb2.WEIGHT_TRANSPORT_NCCL: "nccl",
}


def kind_of(transport: int) -> str | None:
    """The kind of a proto `WeightTransport` value; None for UNSPECIFIED or unknown."""
    return _KINDS.get(transport)


def make_sender(
    kind: str, stub: Any, *, bucket_bytes: int, shared_dir: str | Path | None = None
) -> WeightSender:
    """The trainer-side sender of `kind`; ValueError naming the choices when unknown."""
    if kind == "grpc_stream":
        from rlfleet_weights.grpc_stream import GrpcStreamSender

        return GrpcStreamSender(stub, bucket_bytes)
    if kind == "shared_file":
        from rlfleet_weights.filesystem import FilesystemSender

        if shared_dir is None:
            raise ValueError("weight transport shared_file needs a shared_dir")
        return FilesystemSender(stub, bucket_bytes, Path(shared_dir))
    if kind in ("gloo", "nccl"):
        from rlfleet_weights.collective import CollectiveSender

        return CollectiveSender(stub, bucket_bytes, kind)
    raise ValueError(f"unknown weight transport {kind!r}; choose one of {', '.join(SENDER_KINDS)}")


def make_receiver(kind: str) -> WeightReceiver:
    """The rollout-side receiver of `kind`; ValueError naming the choices when unknown."""
    if kind == "grpc_stream":
        from rlfleet_weights.grpc_stream import GrpcStreamReceiver

        return GrpcStreamReceiver()
    if kind == "shared_file":
        from rlfleet_weights.filesystem import FilesystemReceiver

        return FilesystemReceiver()
    if kind in GROUP_KINDS:
        return make_group_receiver(kind)
    raise ValueError(f"unknown weight receiver {kind!r}; choose one of {', '.join(RECEIVER_KINDS)}")


def make_group_receiver(kind: str) -> GroupReceiver:
    """The engine's member of a weight group of `kind`; ValueError when `kind` forms none."""
    if kind in ("gloo", "nccl"):
        from rlfleet_weights.collective import CollectiveReceiver

        return CollectiveReceiver(kind)
    raise ValueError(
        f"weight transport {kind!r} forms no group; choose one of {', '.join(GROUP_KINDS)}"
    )


def _enum_names(kinds: tuple[str, ...], prefix: str = "") -> str:
    names = [prefix + kind.upper() for kind in kinds]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def update_receiver(transport: int) -> WeightReceiver:
    """The receiver of an `UpdateWeights` request with `transport`; WeightRequestError
    ("transport") naming the transports UpdateWeights carries when it is none of them."""
    kind = kind_of(transport)
    if kind is None or kind in STREAM_KINDS:
        updates = tuple(sorted(k for k in RECEIVER_KINDS if k not in STREAM_KINDS))
        raise WeightRequestError(
            "transport",
            f"must be {_enum_names(updates)} "
            f"({_enum_names(STREAM_KINDS)} goes through StreamWeights)",
        )
    return make_receiver(kind)


def stream_receiver() -> WeightReceiver:
    """The receiver of a `StreamWeights` call."""
    return make_receiver(STREAM_KINDS[0])


def group_kind_of(transport: int) -> str:
    """The group kind of an `InitWeightTransfer` request's `transport`; WeightRequestError
    ("transport") naming the transports that form a group when it is none of them."""
    kind = kind_of(transport)
    if kind is None or kind not in GROUP_KINDS:
        raise WeightRequestError(
            "transport", f"must be {_enum_names(GROUP_KINDS, 'WEIGHT_TRANSPORT_')}"
        )
    return kind
