"""Functions that run *inside* vLLM's workers, sent with `collective_rpc`.

They live in an importable module (not closures) so that the engine-core child process
unpickles them by reference. vLLM only accepts callables when
`VLLM_ALLOW_INSECURE_SERIALIZATION=1`, which `VllmEngine` sets before it starts the
engine. The worker's `GroupReceiver` (its member of the weight group, made by the
weights factory) is kept on the worker object: it must outlive one call.

Loading goes through `model_runner.reload_weights(weights_iterator=...,
is_checkpoint_format=True)`: it maps HF checkpoint names onto vLLM's fused and (on CPU)
repacked parameters. `model.load_weights` directly fails on the CPU backend, and
`reload_weights(weights_path=...)` was measured to give silently wrong logits. On CUDA,
an unquantized model loads with `model.load_weights` (see `_direct_load`): same mapping,
without the layerwise re-materialisation.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlfleet_proto.v1 import rollout_pb2
from rlfleet_weights.factory import make_group_receiver
from rlfleet_weights.plan import BucketPlan, plan_buckets

_RECEIVER_ATTR = "_rlfleet_weight_receiver"
logger = logging.getLogger("vllm.rlfleet_worker")
"""Under vLLM's logger: the engine-core process has vLLM's log handler, not ours."""


def _reload(worker: Any, weights: list[tuple[str, Any]]) -> None:
    if _direct_load(worker):
        # Unquantized model on a GPU: the model's own weight loaders copy each checkpoint
        # tensor into the live (fused) parameters, in place (CUDA graphs stay valid). The
        # layerwise reload below re-materialises every layer first: measured 55-87 ms per
        # update for 135M-1B models on an H100, against a few ms for this.
        worker.model_runner.get_model().load_weights(weights)
        return
    reload = getattr(worker, "reload_weights", None)
    if reload is not None:
        reload(weights_iterator=weights, is_checkpoint_format=True)
    else:
        worker.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)


def _direct_load(worker: Any) -> bool:
    """`model.load_weights` is right for an unquantized model on CUDA; on the CPU backend
    (weights repacked after loading) and for quantized models only `reload_weights` is.
    RLFLEET_VLLM_RELOAD=1 forces `reload_weights`."""
    import os

    device = getattr(worker, "device", None)
    config = getattr(getattr(worker, "model_runner", None), "model_config", None)
    return (
        getattr(device, "type", "") == "cuda"
        and config is not None
        and getattr(config, "quantization", None) is None
        and os.environ.get("RLFLEET_VLLM_RELOAD") != "1"
    )


def join_weight_group(
    worker: Any,
    master_address: str,
    master_port: int,
    world_size: int,
    rank_offset: int,
    backend: str,
    timeout_s: float,
) -> int:
    """Form (or re-form) this worker's weight group; returns its rank."""
    old = getattr(worker, _RECEIVER_ATTR, None)
    if old is not None:
        old.close()
    rank = rank_offset + int(getattr(worker, "rank", 0))
    receiver = make_group_receiver(backend)
    receiver.join(master_address, master_port, world_size, rank, timeout_s)
    setattr(worker, _RECEIVER_ATTR, receiver)
    return rank


def encode_plan(plan: BucketPlan, bucket_bytes: int) -> bytes:
    """What a worker needs to derive `plan` itself: the tensor list and bucket size, as
    proto bytes (vLLM's msgpack encoding of call arguments would flatten a dataclass)."""
    from rlfleet_weights.plan import proto_dtype

    request = rollout_pb2.UpdateWeightsRequest(bucket_bytes=bucket_bytes)
    for bucket in plan.buckets:
        for slot in bucket.slots:
            request.tensors.add(name=slot.name, shape=slot.shape, dtype=proto_dtype(slot.dtype))
    return request.SerializeToString()


def _decode_plan(encoded: bytes) -> BucketPlan:
    request = rollout_pb2.UpdateWeightsRequest.FromString(encoded)
    return plan_buckets(request.tensors, request.bucket_bytes)


def load_from_group(worker: Any, encoded_plan: bytes) -> int | str:
    """Receive every bucket of the plan over the weight group, then load it; returns
    bytes, or the error (a str) when loading failed midway and the model may be a mix
    of two versions. A transfer that fails raises before anything is loaded, and drops
    the group (it is out of step with its sender)."""
    plan = _decode_plan(encoded_plan)
    receiver = getattr(worker, _RECEIVER_ATTR, None)
    if receiver is None:
        raise RuntimeError("no weight group on this worker: call InitWeightTransfer first")
    start = time.perf_counter()
    try:
        weights = list(receiver.receive_tensors(plan))
    except Exception:
        receiver.close()
        setattr(worker, _RECEIVER_ATTR, None)
        raise
    received = time.perf_counter()
    result = _reload_or_error(worker, weights, plan.total_bytes)
    logger.info(
        "rlfleet weights: received %d bytes in %.2f ms, reload_weights %.2f ms",
        plan.total_bytes,
        (received - start) * 1e3,
        (time.perf_counter() - received) * 1e3,
    )
    return result


def _reload_or_error(worker: Any, weights: list[tuple[str, Any]], nbytes: int) -> int | str:
    try:
        _reload(worker, weights)
    except Exception as exc:  # returned, not raised: the engine must know the model changed
        return f"{type(exc).__name__}: {exc}"
    return nbytes


def drain_group(worker: Any, encoded_plan: bytes) -> None:
    """Consume a refused update's broadcasts so that the sender does not hang."""
    plan = _decode_plan(encoded_plan)
    receiver = getattr(worker, _RECEIVER_ATTR, None)
    if receiver is not None:
        receiver.drain(plan)


def pack_tensors(tensors: dict[str, Any]) -> bytes:
    """Tensors as one `torch.save` blob: vLLM's msgpack encoding of call arguments turns
    tensors nested in a dict into lists, bytes pass through intact."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save({k: v.contiguous() for k, v in tensors.items()}, buffer)
    return buffer.getvalue()


def load_tensors(worker: Any, payload: bytes) -> int | str:
    """Load tensors that came with the call (gRPC stream, shared file); returns bytes,
    or the error (a str) when loading failed midway (see `load_from_group`)."""
    import io

    import torch

    tensors = torch.load(io.BytesIO(payload), weights_only=True)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return _reload_or_error(worker, list(tensors.items()), nbytes)


def has_weight_group(worker: Any) -> bool:
    return getattr(worker, _RECEIVER_ATTR, None) is not None
