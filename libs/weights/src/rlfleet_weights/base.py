"""The interface every weight transport implements.

`WeightSender` is the trainer's side: it publishes one version of the policy's weights to
a rollout service (an `UpdateWeights`/`StreamWeights` call plus whatever carries the
bytes). `WeightReceiver` is the rollout's side: it turns one update (an `UpdateWeights`
request, or the messages of a `StreamWeights` call) into `IncomingWeights`: the tensors
themselves, or the bucket plan of a broadcast that the engine's `GroupReceiver` receives.
The trainer and the rollout hold only these types; which class sits behind them is chosen
once, from the config string or the proto `WeightTransport`, by `factory.py`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from rlfleet_proto.v1 import rollout_pb2

    from rlfleet_weights.plan import BucketPlan


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


class WeightRequestError(ValueError):
    """An update the receiver cannot read; `field` names the proto field at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem)
        self.field = field


@dataclass(frozen=True)
class IncomingWeights:
    """What one update brings: exactly one of `tensors` (already here) or `plan` (the
    buckets follow by broadcast over the engine's weight group)."""

    tensors: dict[str, Any] | None = None
    plan: BucketPlan | None = None


class WeightReceiver:
    """Rollout side of one transport. A transport overrides the entry its updates come
    by: `receive` (an `UpdateWeights` request) or `receive_stream` (`StreamWeights`);
    the other refuses."""

    def receive(self, request: rollout_pb2.UpdateWeightsRequest) -> IncomingWeights:
        """What `request` brings; WeightRequestError naming the field when unreadable."""
        raise WeightRequestError("transport", f"{type(self).__name__} takes no UpdateWeights")

    async def receive_stream(
        self,
        messages: AsyncIterator[rollout_pb2.WeightChunk],
        check_header: Callable[[rollout_pb2.UpdateWeightsRequest], None],
    ) -> tuple[rollout_pb2.UpdateWeightsRequest, IncomingWeights]:
        """The header and what a `StreamWeights` call brings; `check_header` runs before
        any tensor is read (it refuses a stale version by raising)."""
        raise WeightRequestError("transport", f"{type(self).__name__} takes no StreamWeights")


class GroupReceiver(WeightReceiver, ABC):
    """A receiver whose tensors arrive over a process group the engine joins once
    (`InitWeightTransfer`); each update's request carries only the bucket plan."""

    @abstractmethod
    def join(
        self, master_address: str, master_port: int, world_size: int, rank: int, timeout_s: float
    ) -> None:
        """Form (or re-form) the group as `rank`; blocks until every member joined."""

    @property
    @abstractmethod
    def joined(self) -> bool: ...

    @abstractmethod
    def receive_into(
        self, plan: BucketPlan, targets: Mapping[str, torch.Tensor]
    ) -> tuple[int, float]:
        """Receive `plan` straight into `targets`; (bytes, seconds spent copying)."""

    @abstractmethod
    def receive_tensors(self, plan: BucketPlan) -> Iterator[tuple[str, torch.Tensor]]:
        """Receive `plan` as `(name, tensor)` pairs, bucket by bucket."""

    def drain(self, plan: BucketPlan) -> None:
        """Consume a refused update's broadcasts so that the sender is not left hanging."""
        if self.joined:
            for _ in self.receive_tensors(plan):
                pass

    @abstractmethod
    def close(self) -> None: ...
