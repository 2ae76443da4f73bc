"""The transports behind the sender/receiver interface, against a fake rollout stub whose
receivers come from the factory as the rollout's do: filesystem (safetensors file in a
shared folder), gRPC stream (chunks reassembled by the receiver's assembler), collective
(a gloo group between two threads), and the factory that picks one from its config string
or proto enum value."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rlfleet_proto.v1 import common_pb2, rollout_pb2  # noqa: E402
from rlfleet_weights.base import GroupReceiver, WeightPublish, WeightRequestError  # noqa: E402
from rlfleet_weights.collective import GroupSpec, WeightGroup, send_weights  # noqa: E402
from rlfleet_weights.factory import (  # noqa: E402
    RECEIVER_KINDS,
    SENDER_KINDS,
    group_kind_of,
    kind_of,
    make_group_receiver,
    make_receiver,
    make_sender,
    stream_receiver,
    update_receiver,
)
from rlfleet_weights.filesystem import FilesystemSender, read_weights_file  # noqa: E402
from rlfleet_weights.grpc_stream import (  # noqa: E402
    DRAIN_SLACK_BYTES,
    GrpcStreamSender,
    iter_weight_chunks,
)
from rlfleet_weights.plan import dtype_name, proto_dtype, specs_of, tensor_spec  # noqa: E402


class FakeStub:
    """Records what a sender sends; answers like a rollout service that loaded it."""

    def __init__(self) -> None:
        self.requests: list[rollout_pb2.UpdateWeightsRequest] = []
        self.loaded: dict[str, Any] = {}

    async def UpdateWeights(
        self, request: rollout_pb2.UpdateWeightsRequest, timeout: float
    ) -> rollout_pb2.UpdateWeightsResponse:
        self.requests.append(request)
        tensors = update_receiver(request.transport).receive(request).tensors
        assert tensors is not None
        self.loaded = tensors
        return rollout_pb2.UpdateWeightsResponse(weight_version=request.weight_version)

    async def StreamWeights(
        self, messages: Any, timeout: float
    ) -> rollout_pb2.UpdateWeightsResponse:
        header, incoming = await stream_receiver().receive_stream(messages, lambda _: None)
        assert incoming.tensors is not None
        self.requests.append(header)
        self.loaded = incoming.tensors
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
    with pytest.raises(ValueError, match="grpc_stream, shared_file, gloo, nccl"):
        make_receiver("carrier_pigeon")
    with pytest.raises(ValueError, match="gloo, nccl"):
        make_group_receiver("shared_file")
    assert SENDER_KINDS == RECEIVER_KINDS == ("grpc_stream", "shared_file", "gloo", "nccl")


def test_factory_maps_every_transport_enum_value_to_a_receiver() -> None:
    for value in rollout_pb2.WeightTransport.values():
        kind = kind_of(value)
        if value == rollout_pb2.WEIGHT_TRANSPORT_UNSPECIFIED:
            assert kind is None
        else:
            assert kind in RECEIVER_KINDS, rollout_pb2.WeightTransport.Name(value)
            make_receiver(kind)
    assert kind_of(999) is None
    assert group_kind_of(rollout_pb2.WEIGHT_TRANSPORT_NCCL) == "nccl"
    assert isinstance(make_group_receiver("gloo"), GroupReceiver)


def test_wrong_transports_are_refused_naming_the_field() -> None:
    for value in (
        rollout_pb2.WEIGHT_TRANSPORT_UNSPECIFIED,
        rollout_pb2.WEIGHT_TRANSPORT_GRPC_STREAM,
    ):
        with pytest.raises(WeightRequestError) as info:
            update_receiver(value)
        assert info.value.field == "transport"
        assert str(info.value) == (
            "must be GLOO, NCCL or SHARED_FILE (GRPC_STREAM goes through StreamWeights)"
        )
    with pytest.raises(WeightRequestError) as info:
        group_kind_of(rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE)
    assert (info.value.field, str(info.value)) == (
        "transport",
        "must be WEIGHT_TRANSPORT_GLOO or WEIGHT_TRANSPORT_NCCL",
    )
    missing = rollout_pb2.UpdateWeightsRequest(
        transport=rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE, file_path="/nonexistent.safetensors"
    )
    with pytest.raises(WeightRequestError) as info:
        update_receiver(missing.transport).receive(missing)
    assert info.value.field == "file_path" and "cannot read" in str(info.value)
    empty = rollout_pb2.UpdateWeightsRequest(transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO)
    with pytest.raises(WeightRequestError) as info:
        update_receiver(empty.transport).receive(empty)
    assert info.value.field == "tensors"


async def _messages(messages: list[rollout_pb2.WeightChunk]) -> AsyncIterator[Any]:
    for message in messages:
        yield message


def _stream(messages: list[rollout_pb2.WeightChunk], check: Any = lambda _: None) -> Any:
    return asyncio.run(stream_receiver().receive_stream(_messages(messages), check))


def test_stream_receiver_refuses_partial_or_misordered_streams() -> None:
    header = rollout_pb2.UpdateWeightsRequest(weight_version=3)
    chunks = list(iter_weight_chunks(header, dict(_tensors()), chunk_bytes=8))
    got, incoming = _stream(chunks)
    assert got.weight_version == 3 and incoming.plan is None
    _same(incoming.tensors, _tensors())
    cases = [
        (chunks[1:], "header", "must be the header"),
        ([chunks[0], chunks[0]], "header", "only the first message"),
        (chunks[:-2], "tensor", "stream ended before"),
        ([], "header", "before a header arrived"),
    ]
    for messages, field, words in cases:
        with pytest.raises(WeightRequestError, match=words) as info:
            _stream(messages)
        assert info.value.field == field

    def refuse(_: Any) -> None:
        raise RuntimeError("stale")

    with pytest.raises(RuntimeError, match="stale"):  # checked before any tensor is read
        _stream([chunks[0], rollout_pb2.WeightChunk()], refuse)


def test_a_refused_stream_is_read_to_its_end_within_a_bound() -> None:
    """The sender must be done writing when the refusal goes out (else grpc's client may
    report INTERNAL instead): the receiver reads on, up to the declared bytes + slack."""
    header = rollout_pb2.UpdateWeightsRequest(weight_version=3)
    chunks = list(iter_weight_chunks(header, dict(_tensors()), chunk_bytes=8))
    read: list[rollout_pb2.WeightChunk] = []

    async def recorded(messages: list[rollout_pb2.WeightChunk]) -> Any:
        for message in messages:
            read.append(message)
            yield message

    def refuse(_: Any) -> None:
        raise RuntimeError("stale")

    with pytest.raises(RuntimeError, match="stale"):
        asyncio.run(stream_receiver().receive_stream(recorded(chunks), refuse))
    assert len(read) == len(chunks)

    # A refused sender that never stops is read only up to its header's bytes + slack.
    junk = rollout_pb2.WeightChunk(tensor=rollout_pb2.TensorChunk(name="w", data=bytes(1 << 20)))

    async def endless() -> Any:
        yield chunks[0]
        while True:
            read.append(junk)
            yield junk

    read.clear()
    with pytest.raises(RuntimeError, match="stale"):
        asyncio.run(stream_receiver().receive_stream(endless(), refuse))
    assert len(read) == (DRAIN_SLACK_BYTES >> 20) + 1  # stops at the first chunk over it


def test_collective_receiver_receives_the_plan_of_the_request_into_targets() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    state = dict(_tensors())
    request = rollout_pb2.UpdateWeightsRequest(
        transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO, tensors=specs_of(state), bucket_bytes=64
    )
    receiver = make_group_receiver(group_kind_of(request.transport))
    plan = receiver.receive(request).plan
    assert plan is not None and not receiver.joined
    box: dict[str, Any] = {}
    joiner = threading.Thread(
        target=lambda: box.update(tx=WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, "gloo", 30)))
    )
    joiner.start()
    receiver.join("127.0.0.1", port, 2, 1, 30)
    joiner.join()
    targets = {n: torch.zeros_like(t) for n, t in state.items()}
    sender = threading.Thread(target=send_weights, args=(box["tx"], state, 64))
    sender.start()
    nbytes, _ = receiver.receive_into(plan, targets)
    sender.join()
    assert nbytes == plan.total_bytes
    _same(targets, list(state.items()))
    sender = threading.Thread(target=send_weights, args=(box["tx"], state, 64))
    sender.start()
    receiver.drain(plan)  # a refused update's buckets are consumed, the sender released
    sender.join(30)
    assert not sender.is_alive()
    receiver.close()
    box["tx"].close()
    assert not receiver.joined


def test_one_dtype_table_float8_included() -> None:
    spec = tensor_spec("q", torch.zeros(2, 2, dtype=torch.float8_e4m3fn))
    assert spec.dtype == common_pb2.DTYPE_FLOAT8_E4M3
    assert dtype_name(proto_dtype(torch.bfloat16)) == "bfloat16"
    with pytest.raises(ValueError, match=r"q: dtype torch\.complex64"):
        tensor_spec("q", torch.zeros(1, dtype=torch.complex64))
