"""Bucket plans and the gRPC-stream framing of weights (rlfleet_weights), a gloo
broadcast between two processes through a group built from a TCPStore, and the functions
vLLM's workers run to receive over that group."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from rlfleet_core.ports import pick_free_port
from rlfleet_proto.v1 import rollout_pb2
from rlfleet_weights.collective import GroupSpec, WeightGroup, send_weights
from rlfleet_weights.grpc_stream import WeightAssembler, iter_weight_chunks
from rlfleet_weights.plan import plan_buckets, specs_of


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(3, 5, generator=gen),
        "b": torch.randn(7, generator=gen).to(torch.bfloat16),
        "empty": torch.empty(0, 4),
        "big": torch.randn(64, 64, generator=gen),
        "ids": torch.arange(5, dtype=torch.int64),
    }


def test_plan_is_deterministic_aligned_and_bounded() -> None:
    specs = specs_of(_state())
    plan = plan_buckets(specs, bucket_bytes=256)
    assert plan == plan_buckets(rollout_pb2.UpdateWeightsRequest(tensors=specs).tensors, 256)
    assert plan.total_bytes == sum(t.numel() * t.element_size() for t in _state().values())
    names = [s.name for b in plan.buckets for s in b.slots]
    assert names == ["a", "b", "empty", "big", "ids"]
    for bucket in plan.buckets:
        assert all(slot.offset % 8 == 0 for slot in bucket.slots)
        # Only a lone tensor may exceed the bucket size.
        assert bucket.nbytes <= 256 or len(bucket.slots) == 1
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(specs, 0)


def test_stream_chunks_reassemble_exactly() -> None:
    state = _state()
    chunks = list(
        iter_weight_chunks(rollout_pb2.UpdateWeightsRequest(weight_version=3), state, 100)
    )
    header = chunks[0].header
    assert header.weight_version == 3
    assert header.transport == rollout_pb2.WEIGHT_TRANSPORT_GRPC_STREAM
    assembler = WeightAssembler(header.tensors)
    for chunk in chunks[1:]:
        assert len(chunk.tensor.data) <= 100
        assembler.add(chunk.tensor)
    out = assembler.result()
    for name, tensor in state.items():
        assert out[name].dtype == tensor.dtype
        assert torch.equal(out[name], tensor)


def test_stream_refuses_out_of_order_and_truncated_streams() -> None:
    state = _state()
    chunks = list(iter_weight_chunks(rollout_pb2.UpdateWeightsRequest(weight_version=1), state, 64))
    assembler = WeightAssembler(chunks[0].header.tensors)
    with pytest.raises(ValueError, match="expected 'a'"):
        assembler.add(rollout_pb2.TensorChunk(name="b", data=b"\0" * 4))
    assembler = WeightAssembler(chunks[0].header.tensors)
    assembler.add(chunks[1].tensor)
    with pytest.raises(ValueError, match="stream ended before tensor 'b'"):
        assembler.result()


_RECEIVER = """
import sys, torch
from rlfleet_weights.collective import GroupSpec, WeightGroup, receive_weights
from rlfleet_weights.plan import plan_buckets, specs_of
from rlfleet_proto.v1 import rollout_pb2
port, out = int(sys.argv[1]), sys.argv[2]
header = rollout_pb2.UpdateWeightsRequest.FromString(open(out + ".header", "rb").read())
group = WeightGroup(GroupSpec("127.0.0.1", port, 2, 1, "gloo", 30))
plan = plan_buckets(header.tensors, 512)
torch.save({k: v.clone() for k, v in receive_weights(group, plan)}, out)
"""


def test_gloo_broadcast_between_processes_moves_exact_tensors(tmp_path: Path) -> None:
    """The receiver learns the tensor list from the header only, as over gRPC."""
    port = pick_free_port()
    out = tmp_path / "received.pt"
    header = rollout_pb2.UpdateWeightsRequest(tensors=specs_of(_state()))
    Path(f"{out}.header").write_bytes(header.SerializeToString())
    proc = subprocess.Popen([sys.executable, "-c", _RECEIVER, str(port), str(out)])
    try:
        group = WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, "gloo", 30))
        send_weights(group, _state(), 512)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    got = torch.load(out)
    for name, tensor in _state().items():
        assert torch.equal(got[name], tensor), name
    assert not torch.distributed.is_initialized()  # the default group was never touched


class _FakeVllmWorker:
    """What `vllm_worker` uses of a vLLM worker: its rank and `reload_weights`."""

    rank = 0

    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def reload_weights(self, weights_iterator: Any, is_checkpoint_format: bool) -> None:
        self.loaded = dict(weights_iterator)


def test_vllm_worker_functions_receive_and_drain_through_the_group_receiver() -> None:
    """join_weight_group / load_from_group / drain_group, as collective_rpc runs them."""
    from rlfleet_rollout.engines import vllm_worker

    port = pick_free_port()
    worker = _FakeVllmWorker()
    box: dict[str, Any] = {}
    sender = threading.Thread(
        target=lambda: box.update(tx=WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, "gloo", 30)))
    )
    sender.start()
    rank = vllm_worker.join_weight_group(worker, "127.0.0.1", port, 2, 1, "gloo", 30.0)
    sender.join()
    assert rank == 1 and vllm_worker.has_weight_group(worker)
    plan = plan_buckets(specs_of(_state()), 512)
    encoded = vllm_worker.encode_plan(plan, 512)
    for receive in (vllm_worker.load_from_group, vllm_worker.drain_group):
        sender = threading.Thread(target=send_weights, args=(box["tx"], _state(), 512))
        sender.start()
        receive(worker, encoded)
        sender.join(30)
        assert not sender.is_alive()
    for name, tensor in _state().items():
        assert torch.equal(worker.loaded[name], tensor), name
    box["tx"].close()
