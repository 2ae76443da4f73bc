"""The interface every weight transport implements.

`WeightSender` is the trainer's side: it publishes one version of the policy's weights to
a rollout service (an `UpdateWeights`/`StreamWeights` call plus whatever carries the
bytes). `WeightReceiver` is the rollout's side: it turns one update request into the
tensors the engine loads. The trainer and the rollout hold only these types; which class
sits behind them is chosen once, from the config string, by `factory.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from rlfleet_proto.v1 import rollout_pb2


@dataclass(frozen=True)
class WeightPublish:
    """What travels with every update besides the tensors."""

    version: int
    recompute_kv_cache: bool = False
    """Recompute the KV cache of requests in flight under the new weights."""


class WeightSender(ABC):
    """Trainer side of one transport. `stub` is the RolloutService aio stub."""

    def __init__(self, stub: Any, bucket_bytes: int) -> None:
        self.stub = stub
        self.bucket_bytes = bucket_bytes

    async def init(self) -> None:  # noqa: B027 (most transports need no setup)
        """Set up what the transport needs before the first publish (called once)."""

    @abstractmethod
    async def publish(
        self, update: WeightPublish, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> rollout_pb2.UpdateWeightsResponse:
        """Send `tensors` (HF names, send order) as `update.version`; the rollout's reply."""

    async def close(self) -> None:  # noqa: B027 (most transports hold nothing)
        """Release what `init` set up."""


class WeightReceiver(ABC):
    """Rollout side of one transport: the tensors of one update request."""

    @abstractmethod
    def receive(self, request: rollout_pb2.UpdateWeightsRequest) -> dict[str, Any]:
        """`name -> tensor` of the update; ValueError when the request cannot be read."""
