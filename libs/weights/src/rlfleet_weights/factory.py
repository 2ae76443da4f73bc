"""Choose a weight transport once, from its config string (`services.weight_transport`).

Kinds: `grpc_stream` (chunks of a StreamWeights call), `shared_file` (a safetensors file
in a folder both sides read), `gloo` / `nccl` (a broadcast over a process group of its
own). Only this module maps names to classes; everything else holds a `WeightSender` or
`WeightReceiver`. A new transport is one module with its sender (and receiver) plus one
entry here. vLLM's native weight transfer (`vllm.distributed.weight_transfer`) would be
such a module: a sender that drives vLLM's own engine-side receiver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfleet_weights.base import WeightReceiver, WeightSender

SENDER_KINDS = ("grpc_stream", "shared_file", "gloo", "nccl")
RECEIVER_KINDS = ("shared_file",)


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
    """The rollout-side receiver of `kind` for transports whose tensors arrive in the
    request itself; ValueError naming the choices when unknown."""
    if kind == "shared_file":
        from rlfleet_weights.filesystem import FilesystemReceiver

        return FilesystemReceiver()
    raise ValueError(f"unknown weight receiver {kind!r}; choose one of {', '.join(RECEIVER_KINDS)}")
