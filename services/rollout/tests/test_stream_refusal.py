"""A refused StreamWeights reaches the client as its own status code, every time.

grpc's asyncio client reports INTERNAL "Internal error from Core" when one of its writes
fails because the server already answered, and that races with the server's real status.
Before the receiver read a refused stream to its end, about 1 replay in 100 (up to 1 in 4
under load) of a stale stream lost its FAILED_PRECONDITION that way: the flaky
`test_pool.py` failure. Many concurrent replays of small chunks make the race frequent.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio
from rlfleet_core.client import connect
from rlfleet_core.models import resolve_model
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.service import SERVICE
from rlfleet_weights.grpc_stream import iter_weight_chunks
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow

REPLAYS = 2048
CONCURRENT = 64


@pytest.mark.asyncio
async def test_stale_stream_replays_are_all_failed_precondition() -> None:
    weights = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).state_dict()
    header = rollout_pb2.UpdateWeightsRequest(weight_version=1)
    chunks = list(iter_weight_chunks(header, weights, chunk_bytes=64 << 10))

    async def source() -> AsyncIterator[rollout_pb2.WeightChunk]:
        for chunk in chunks:
            yield chunk

    async with (
        running_service(SERVICE, ["engine=hf", "model=tiny"]) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=60) as channel,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        assert (await stub.StreamWeights(source(), timeout=60)).weight_version == 1
        codes: Counter[str] = Counter()

        async def replay(count: int) -> None:
            for _ in range(count):
                with pytest.raises(aio.AioRpcError) as info:
                    await stub.StreamWeights(source(), timeout=60)
                codes[f"{info.value.code().name}: {info.value.details()}"] += 1

        await asyncio.gather(*(replay(REPLAYS // CONCURRENT) for _ in range(CONCURRENT)))
        refused = f"{grpc.StatusCode.FAILED_PRECONDITION.name}: weight_version 1 is not newer"
        assert sum(codes.values()) == REPLAYS
        assert all(code.startswith(refused) for code in codes), dict(codes)
        # The server kept its own state through the replays.
        status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.weight_version == 1
