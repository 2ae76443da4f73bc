"""Where the collective weight group meets: the address and port come from the launcher's
environment (RLFLEET_WEIGHT_SYNC_HOST/PORT), the store binds its own free port (no
pick-then-rebind), and forming the group is retried a bounded number of times. The rollout
side is a stub whose engine member is the real `CollectiveReceiver`, joined at the address
the InitWeightTransfer request advertises (as the rollout's engines join)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rlfleet_proto.v1 import rollout_pb2  # noqa: E402
from rlfleet_weights.base import WeightPublish  # noqa: E402
from rlfleet_weights.collective import (  # noqa: E402
    HOST_ENV,
    PORT_ENV,
    CollectiveReceiver,
    CollectiveSender,
    rendezvous_endpoint,
)


class StubRollout:
    """GetStatus / InitWeightTransfer / UpdateWeights of a one-engine rollout; the first
    `refuse` InitWeightTransfer calls fail (a rollout still starting)."""

    def __init__(self, refuse: int = 0) -> None:
        self.receiver = CollectiveReceiver("gloo")
        self.requests: list[rollout_pb2.InitWeightTransferRequest] = []
        self.refuse = refuse
        self.received: dict[str, Any] = {}

    async def GetStatus(self, request: Any, timeout: float) -> Any:
        return rollout_pb2.RolloutStatus(num_replicas=1)

    async def InitWeightTransfer(self, request: Any, timeout: float) -> Any:
        self.requests.append(request)
        if self.refuse:
            self.refuse -= 1
            raise ConnectionError("rollout not ready")
        await asyncio.to_thread(
            self.receiver.join,
            request.master_address,
            request.master_port,
            request.world_size,
            request.rank_offset,
            request.timeout_s,
        )
        return rollout_pb2.InitWeightTransferResponse()

    async def UpdateWeights(self, request: Any, timeout: float) -> Any:
        plan = self.receiver.receive(request).plan
        assert plan is not None
        self.received = {n: t.clone() for n, t in self.receiver.receive_tensors(plan)}
        return rollout_pb2.UpdateWeightsResponse(weight_version=request.weight_version)


def _routable_address() -> str | None:
    """A non-loopback address of this machine (the interface a default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def _round_trip(sender: CollectiveSender, stub: StubRollout) -> None:
    state = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(5)}
    await sender.init()
    await sender.publish(WeightPublish(version=1), state.items())
    await sender.close()
    stub.receiver.close()
    assert set(stub.received) == set(state)
    for name, tensor in state.items():
        assert torch.equal(stub.received[name], tensor)


def test_the_advertised_address_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    address = _routable_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    monkeypatch.setenv(HOST_ENV, address)
    monkeypatch.delenv(PORT_ENV, raising=False)
    stub = StubRollout()
    sender = CollectiveSender(stub, 16, "gloo", timeout_s=30)
    asyncio.run(_round_trip(sender, stub))
    (request,) = stub.requests
    assert request.master_address == address  # never a hard-coded loopback
    assert request.master_port > 0  # the port the store really bound


def test_default_is_loopback_and_a_free_port() -> None:
    assert rendezvous_endpoint({}) == ("127.0.0.1", 0)
    assert rendezvous_endpoint({HOST_ENV: "node-7", PORT_ENV: "29600"}) == ("node-7", 29600)
    for bad in ("x", "70000", "-1"):
        with pytest.raises(ValueError, match=f"{PORT_ENV} .* must be a port number"):
            rendezvous_endpoint({PORT_ENV: bad})


def test_forming_the_group_is_retried_then_fails_naming_the_address() -> None:
    stub = StubRollout(refuse=1)
    sender = CollectiveSender(
        stub, 16, "gloo", timeout_s=30, endpoint=("127.0.0.1", 0), backoff_s=0.05
    )
    asyncio.run(_round_trip(sender, stub))
    assert len(stub.requests) == 2  # the refused try, then the one that formed the group

    stub = StubRollout(refuse=5)
    sender = CollectiveSender(
        stub, 16, "gloo", timeout_s=2, endpoint=("127.0.0.1", 0), attempts=2, backoff_s=0.05
    )
    with pytest.raises(RuntimeError, match=r"weight group at 127.0.0.1:\(free port\) not formed"):
        asyncio.run(sender.init())
    assert len(stub.requests) == 2
