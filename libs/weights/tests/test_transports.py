"""The transports behind the sender/receiver interface, against a fake rollout stub:
filesystem (safetensors file in a shared folder), gRPC stream (chunks reassembled by the
receiver's assembler), and the factory that picks one from its config string."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rlfleet_proto.v1 import common_pb2, rollout_pb2  # noqa: E402
from rlfleet_weights.base import WeightPublish  # noqa: E402
from rlfleet_weights.factory import SENDER_KINDS, make_receiver, make_sender  # noqa: E402
from rlfleet_weights.filesystem import FilesystemSender, read_weights_file  # noqa: E402
from rlfleet_weights.grpc_stream import GrpcStreamSender, WeightAssembler  # noqa: E402
from rlfleet_weights.plan import dtype_name, proto_dtype, tensor_spec  # noqa: E402


class FakeStub:
    """Records what a sender sends; answers like a rollout service that loaded it."""

    def __init__(self) -> None:
        self.requests: list[rollout_pb2.UpdateWeightsRequest] = []
        self.loaded: dict[str, Any] = {}

    async def UpdateWeights(
        self, request: rollout_pb2.UpdateWeightsRequest, timeout: float
    ) -> rollout_pb2.UpdateWeightsResponse:
        self.requests.append(request)
        self.loaded = make_receiver("shared_file").receive(request)
        return rollout_pb2.UpdateWeightsResponse(weight_version=request.weight_version)

    async def StreamWeights(
        self, messages: Any, timeout: float
    ) -> rollout_pb2.UpdateWeightsResponse:
        assembler: WeightAssembler | None = None
        header = None
        async for message in messages:
            if message.HasField("header"):
                header = message.header
                assembler = WeightAssembler(header.tensors)
            else:
                assert assembler is not None
                assembler.add(message.tensor)
        assert assembler is not None and header is not None
        self.requests.append(header)
        self.loaded = assembler.result()
        return rollout_pb2.UpdateWeightsResponse(weight_version=header.weight_version)


def _tensors() -> list[tuple[str, Any]]:
    gen = torch.Generator().manual_seed(0)
    return [
        ("w", torch.randn(4, 3, generator=gen)),
        ("b", torch.randn(3, generator=gen).to(torch.bfloat16)),
        ("ids", torch.arange(5, dtype=torch.int64)),
        ("empty", torch.zeros(0)),
    ]


def _same(loaded: dict[str, Any], sent: list[tuple[str, Any]]) -> None:
    assert sorted(loaded) == sorted(name for name, _ in sent)
    for name, tensor in sent:
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor)


def test_filesystem_sender_writes_a_file_the_receiver_reads(tmp_path: Path) -> None:
    stub = FakeStub()
    sender = FilesystemSender(stub, 1 << 20, tmp_path / "shared")
    for version in (1, 2):
        reply = asyncio.run(sender.publish(WeightPublish(version), _tensors()))
        assert reply.weight_version == version
    request = stub.requests[-1]
    assert request.transport == rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE
    assert [s.name for s in request.tensors] == [name for name, _ in _tensors()]
    _same(stub.loaded, _tensors())
    # Only the newest version stays; no temporary file is left behind.
    assert [p.name for p in (tmp_path / "shared").iterdir()] == [Path(request.file_path).name]


def test_reading_a_missing_or_unnamed_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs the path"):
        read_weights_file("")
    with pytest.raises(ValueError, match="cannot read"):
        read_weights_file(str(tmp_path / "nope.safetensors"))


def test_grpc_stream_sender_round_trips_through_the_assembler() -> None:
    stub = FakeStub()
    sender = make_sender("grpc_stream", stub, bucket_bytes=16)  # several chunks per tensor
    assert isinstance(sender, GrpcStreamSender)
    asyncio.run(sender.publish(WeightPublish(7, recompute_kv_cache=True), _tensors()))
    header = stub.requests[-1]
    assert header.weight_version == 7 and header.recompute_kv_cache
    assert header.transport == rollout_pb2.WEIGHT_TRANSPORT_GRPC_STREAM
    _same(stub.loaded, _tensors())


def test_factory_names_the_choices_for_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="grpc_stream, shared_file, gloo, nccl"):
        make_sender("carrier_pigeon", FakeStub(), bucket_bytes=1)
    with pytest.raises(ValueError, match="shared_dir"):
        make_sender("shared_file", FakeStub(), bucket_bytes=1)
    with pytest.raises(ValueError, match="shared_file"):
        make_receiver("carrier_pigeon")
    assert SENDER_KINDS == ("grpc_stream", "shared_file", "gloo", "nccl")


def test_one_dtype_table_float8_included() -> None:
    spec = tensor_spec("q", torch.zeros(2, 2, dtype=torch.float8_e4m3fn))
    assert spec.dtype == common_pb2.DTYPE_FLOAT8_E4M3
    assert dtype_name(proto_dtype(torch.bfloat16)) == "bfloat16"
    with pytest.raises(ValueError, match=r"q: dtype torch\.complex64"):
        tensor_spec("q", torch.zeros(1, dtype=torch.complex64))
