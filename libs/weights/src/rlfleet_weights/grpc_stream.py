"""gRPC-stream transport: the same tensors as the collective path, sent as raw chunks of a
`StreamWeights` call, for when no process group can be formed (firewalls, different
clusters). `iter_weight_chunks` is the sender's message stream, `WeightAssembler` the
receiver's checked reassembly, which `GrpcStreamReceiver` feeds with the call's chunks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from rlfleet_proto.v1 import common_pb2, rollout_pb2

from rlfleet_weights.base import (
    IncomingWeights,
    WeightPublish,
    WeightReceiver,
    WeightRequestError,
    WeightSender,
)
from rlfleet_weights.plan import dtype_name, specs_of, tensor_nbytes

if TYPE_CHECKING:
    import torch

DEFAULT_CHUNK_BYTES = 4 << 20
"""gRPC stream chunk: well under the default 64 MiB message cap."""


def iter_weight_chunks(
    header: rollout_pb2.UpdateWeightsRequest,
    state_dict: Mapping[str, torch.Tensor],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> Iterator[rollout_pb2.WeightChunk]:
    """Messages of a `StreamWeights` call: the header (with `tensors` filled from
    `state_dict` when empty), then each tensor's raw bytes in chunks, in header order
    (at least one chunk per tensor, empty for a zero-size tensor)."""
    import torch

    header = rollout_pb2.UpdateWeightsRequest.FromString(header.SerializeToString())
    if not header.tensors:
        header.tensors.extend(specs_of(state_dict))
    header.transport = rollout_pb2.WEIGHT_TRANSPORT_GRPC_STREAM
    yield rollout_pb2.WeightChunk(header=header)
    for spec in header.tensors:
        raw = state_dict[spec.name].detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        data = raw.numpy().tobytes()
        for offset in range(0, max(len(data), 1), chunk_bytes):
            yield rollout_pb2.WeightChunk(
                tensor=rollout_pb2.TensorChunk(
                    name=spec.name, offset_bytes=offset, data=data[offset : offset + chunk_bytes]
                )
            )


class WeightAssembler:
    """Receiver side of `iter_weight_chunks`: checks order and sizes, builds tensors.

    Raises ValueError naming the tensor when a chunk is out of order, unexpected or
    the stream ends early: a partial update must never be applied.
    """

    def __init__(self, specs: Iterable[common_pb2.TensorSpec]) -> None:
        self.slots = [(s.name, tuple(int(d) for d in s.shape), dtype_name(s.dtype)) for s in specs]
        self.index = 0
        self.buffer = bytearray()
        self.tensors: dict[str, Any] = {}
        self.bytes_received = 0

    def _expected(self) -> tuple[str, tuple[int, ...], str]:
        if self.index >= len(self.slots):
            raise ValueError("tensor chunk after the last tensor of the header")
        return self.slots[self.index]

    def add(self, chunk: rollout_pb2.TensorChunk) -> None:
        name, shape, dtype = self._expected()
        if chunk.name != name:
            raise ValueError(f"tensor chunk for {chunk.name!r}, expected {name!r} (header order)")
        if chunk.offset_bytes != len(self.buffer):
            raise ValueError(
                f"{name}: chunk at offset {chunk.offset_bytes}, expected {len(self.buffer)}"
            )
        self.buffer.extend(chunk.data)
        self.bytes_received += len(chunk.data)
        need = tensor_nbytes(shape, dtype)
        if len(self.buffer) > need:
            raise ValueError(f"{name}: {len(self.buffer)} bytes received, tensor has {need}")
        if len(self.buffer) == need:
            self._finish(name, shape, dtype)

    def _finish(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        import torch

        flat = (
            torch.frombuffer(self.buffer, dtype=torch.uint8)
            if self.buffer
            else (torch.empty(0, dtype=torch.uint8))
        )
        self.tensors[name] = flat.view(getattr(torch, dtype)).view(shape)
        self.buffer = bytearray()
        self.index += 1

    def result(self) -> dict[str, Any]:
        if self.index != len(self.slots):
            name = self.slots[self.index][0]
            raise ValueError(
                f"stream ended before tensor {name!r} was complete "
                f"({len(self.tensors)} of {len(self.slots)} tensors)"
            )
        return self.tensors


class GrpcStreamSender(WeightSender):
    """StreamWeights: a header with every tensor's spec, then raw chunks in order."""

    async def publish(
        self, update: WeightPublish, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> rollout_pb2.UpdateWeightsResponse:
        state = {name: t.detach().cpu().contiguous() for name, t in tensors}
        header = rollout_pb2.UpdateWeightsRequest(
            weight_version=update.version,
            bucket_bytes=self.bucket_bytes,
            recompute_kv_cache=update.recompute_kv_cache,
        )
        chunk_bytes = min(self.bucket_bytes, 16 << 20)

        async def messages() -> AsyncIterator[rollout_pb2.WeightChunk]:
            for message in iter_weight_chunks(header, state, chunk_bytes):
                yield message

        reply: rollout_pb2.UpdateWeightsResponse = await self.stub.StreamWeights(
            messages(), timeout=600.0
        )
        return reply


DRAIN_SLACK_BYTES = 16 << 20
"""Bytes a refused stream may carry beyond what its header declared (all of it when no
header was read) and still be read to its end before the refusal is sent."""


class GrpcStreamReceiver(WeightReceiver):
    """StreamWeights: the header first (checked before any tensor is read), then the
    chunks through a `WeightAssembler`; nothing is returned unless every tensor arrived.

    A refused stream (stale header, bad chunk) is read to its end before the error is
    raised. grpc's asyncio client turns a write that fails because the server already
    answered into INTERNAL "Internal error from Core", and that races with the real status
    (a stale replay saw it about 1 time in 100 here): the sender must be done writing when
    the refusal is sent. The chunks read after a refusal are dropped, never assembled, up
    to the header's declared bytes plus `DRAIN_SLACK_BYTES`; the call's deadline bounds
    the time."""

    async def receive_stream(
        self,
        messages: AsyncIterator[rollout_pb2.WeightChunk],
        check_header: Callable[[rollout_pb2.UpdateWeightsRequest], None],
    ) -> tuple[rollout_pb2.UpdateWeightsRequest, IncomingWeights]:
        state = _StreamState()
        try:
            async for message in messages:
                state.add(message, check_header)
        except Exception:
            await _drain(messages, state.remaining_bytes())
            raise
        return state.result()


class _StreamState:
    """One StreamWeights call's progress: its header, then the assembler of its chunks."""

    def __init__(self) -> None:
        self.header: rollout_pb2.UpdateWeightsRequest | None = None
        self.assembler: WeightAssembler | None = None
        self.bytes_seen = 0

    def add(
        self,
        message: rollout_pb2.WeightChunk,
        check_header: Callable[[rollout_pb2.UpdateWeightsRequest], None],
    ) -> None:
        if message.HasField("header"):
            if self.header is not None:
                raise WeightRequestError("header", "only the first message may be a header")
            self.header = message.header
            check_header(self.header)
            try:
                self.assembler = WeightAssembler(self.header.tensors)
            except ValueError as exc:
                raise WeightRequestError("header.tensors", str(exc)) from None
            return
        self.bytes_seen += len(message.tensor.data)
        if self.assembler is None:
            raise WeightRequestError("header", "the first message must be the header")
        try:
            self.assembler.add(message.tensor)
        except ValueError as exc:
            raise WeightRequestError("tensor", str(exc)) from None

    def remaining_bytes(self) -> int:
        """How much more a well-behaved sender may still send, plus the slack."""
        declared = 0
        if self.header is not None:
            try:
                declared = sum(
                    max(tensor_nbytes(tuple(s.shape), dtype_name(s.dtype)), 0)
                    for s in self.header.tensors
                )
            except ValueError:
                declared = 0
        return max(declared - self.bytes_seen, 0) + DRAIN_SLACK_BYTES

    def result(self) -> tuple[rollout_pb2.UpdateWeightsRequest, IncomingWeights]:
        if self.header is None or self.assembler is None:
            raise WeightRequestError("header", "stream ended before a header arrived")
        try:
            return self.header, IncomingWeights(tensors=self.assembler.result())
        except ValueError as exc:
            raise WeightRequestError("tensor", str(exc)) from None


async def _drain(messages: AsyncIterator[rollout_pb2.WeightChunk], limit_bytes: int) -> None:
    """Read and drop the rest of a refused stream, up to `limit_bytes` of chunk data."""
    async for message in messages:
        limit_bytes -= len(message.tensor.data)
        if limit_bytes < 0:
            return
