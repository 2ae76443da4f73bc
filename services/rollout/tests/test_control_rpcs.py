"""Control RPCs a client could abuse: a version far ahead, a file anywhere on the host.

A version of 2^63 - 1 used to be accepted, making every later trainer publish stale for
good; a SHARED_FILE update loaded whatever path it named. Both are refused now, naming
the field and the setting, and leave the served weights as they were.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from rlfleet_core.client import connect
from rlfleet_core.models import resolve_model
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.service import SERVICE
from rlfleet_weights.filesystem import write_weights_file
from rlfleet_weights.grpc_stream import iter_weight_chunks
from rlfleet_weights.plan import specs_of
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow


@pytest.mark.asyncio
async def test_far_versions_and_files_outside_the_roots_are_refused(tmp_path: Path) -> None:
    weights = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).state_dict()
    weights = {k: v.contiguous() for k, v in weights.items()}
    root, outside = tmp_path / "shared", tmp_path / "elsewhere"
    inside_file = write_weights_file(root, 3, weights)
    outside_file = write_weights_file(outside, 3, weights)
    (root / "escape.safetensors").symlink_to(outside_file)
    overrides = ["engine=hf", "model=tiny", f"weight_file_roots=[{root}]"]
    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=60) as channel,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)

        async def stream(version: int) -> rollout_pb2.UpdateWeightsResponse:
            header = rollout_pb2.UpdateWeightsRequest(weight_version=version)

            async def source() -> AsyncIterator[rollout_pb2.WeightChunk]:
                for chunk in iter_weight_chunks(header, weights):
                    yield chunk

            reply: rollout_pb2.UpdateWeightsResponse = await stub.StreamWeights(source())
            return reply

        async def version() -> int:
            return (await stub.GetStatus(rollout_pb2.GetStatusRequest())).weight_version

        with pytest.raises(aio.AioRpcError) as info:
            await stream(2**63 - 1)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = info.value.details() or ""
        assert details.startswith("weight_version:") and "max_weight_version_jump" in details
        assert await version() == 0
        assert (await stream(2)).weight_version == 2

        def from_file(path: Path | str) -> rollout_pb2.UpdateWeightsRequest:
            return rollout_pb2.UpdateWeightsRequest(
                weight_version=3,
                transport=rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE,
                tensors=specs_of(weights),
                file_path=str(path),
            )

        for path in ("/etc/passwd", outside_file, root / "escape.safetensors", root / ".." / "x"):
            with pytest.raises(aio.AioRpcError) as info:
                await stub.UpdateWeights(from_file(path))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, path
            details = info.value.details() or ""
            assert details.startswith(f"file_path: {path} ") and "weight_file_roots" in details
        assert await version() == 2
        assert (await stub.UpdateWeights(from_file(inside_file))).weight_version == 3
