"""UpdateWeights(SHARED_FILE) reads its safetensors file off the event loop, keeps the
order the updates arrived in, and refuses a stale version before reading anything.

The read used to run on the service's event loop: for the seconds a multi-GB file takes,
the rollout answered nothing (no generation, no GetStatus, no health check). The real
gRPC service on loopback, engine=scripted (no model: the engine is not what is tested);
the file read is wrapped so the test can hold it while it checks the loop is free.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
import torch
from grpc import aio
from rlfleet_core.client import connect
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.service import SERVICE
from rlfleet_weights import filesystem
from rlfleet_weights.filesystem import write_weights_file
from rlfleet_weights.plan import specs_of

WAIT_S = 30.0
"""Bound on each wait, so that the old code (the read blocking the loop) fails, not hangs."""
WEIGHTS = {"w": torch.zeros(4)}


class HeldReads:
    """Wraps the file read: a read of a held path waits (in whatever thread runs it)
    until released, and records whether it was released, i.e. whether the event loop
    could run the test's code while the read was in progress."""

    def __init__(self, real: Callable[[str], dict[str, Any]]) -> None:
        self.real = real
        self.held: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}
        self.read: list[tuple[str, bool]] = []

    def hold(self, path: Path) -> None:
        self.held[str(path)] = threading.Event()
        self.started[str(path)] = threading.Event()

    def __call__(self, path: str) -> dict[str, Any]:
        released = True
        if path in self.held:
            self.started[path].set()
            released = self.held[path].wait(WAIT_S)
        self.read.append((Path(path).name, released))
        return self.real(path)


@pytest_asyncio.fixture
async def rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[rollout_pb2_grpc.RolloutServiceStub, Path, HeldReads]]:
    reads = HeldReads(filesystem.read_weights_file)
    monkeypatch.setattr(filesystem, "read_weights_file", reads)
    script = tmp_path / "turns.jsonl"
    script.write_text('{"text": "ok"}\n')
    root = tmp_path / "shared"
    overrides = ["engine=scripted", f"script_path={script}", "model=tiny"]
    overrides.append(f"weight_file_roots=[{root}]")
    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=60) as channel,
    ):
        yield rollout_pb2_grpc.RolloutServiceStub(channel), root, reads


def from_file(path: Path, version: int) -> rollout_pb2.UpdateWeightsRequest:
    return rollout_pb2.UpdateWeightsRequest(
        weight_version=version,
        transport=rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE,
        tensors=specs_of(WEIGHTS),
        file_path=str(path),
    )


async def version_of(stub: rollout_pb2_grpc.RolloutServiceStub) -> int:
    status = await stub.GetStatus(rollout_pb2.GetStatusRequest())
    return int(status.weight_version)


@pytest.mark.asyncio
async def test_the_loop_answers_while_a_weight_file_is_read(
    rollout: tuple[rollout_pb2_grpc.RolloutServiceStub, Path, HeldReads],
) -> None:
    stub, root, reads = rollout
    first, second = write_weights_file(root, 1, WEIGHTS), write_weights_file(root, 2, WEIGHTS)
    reads.hold(first)
    update_1 = asyncio.ensure_future(stub.UpdateWeights(from_file(first, 1)))
    assert await asyncio.to_thread(reads.started[str(first)].wait, WAIT_S)
    # GetStatus is answered while version 1's file is still being read...
    assert await version_of(stub) == 0
    # ...and version 2, sent after it, waits its turn instead of overtaking it.
    update_2 = asyncio.ensure_future(stub.UpdateWeights(from_file(second, 2)))
    assert await version_of(stub) == 0
    reads.held[str(first)].set()
    assert (await update_1).weight_version == 1
    assert (await update_2).weight_version == 2
    assert await version_of(stub) == 2
    assert reads.read == [(first.name, True), (second.name, True)]


@pytest.mark.asyncio
async def test_a_stale_version_is_refused_before_its_file_is_read(
    rollout: tuple[rollout_pb2_grpc.RolloutServiceStub, Path, HeldReads],
) -> None:
    stub, root, reads = rollout
    path = write_weights_file(root, 1, WEIGHTS)
    assert (await stub.UpdateWeights(from_file(path, 1))).weight_version == 1
    with pytest.raises(aio.AioRpcError) as info:
        await stub.UpdateWeights(from_file(path, 1))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not newer" in (info.value.details() or "")
    assert [name for name, _ in reads.read] == [path.name]  # the refused one was not read
