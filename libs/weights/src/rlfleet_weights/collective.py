"""Collective transport: a process group used only for weights (TCPStore rendezvous +
ProcessGroupGloo on CPU, ProcessGroupNCCL on GPU), built without `init_process_group`, so
it never touches either side's default group (the trainer's DP/TP groups, vLLM's own). The
same code runs gloo in CI and NCCL on GPUs; only the backend name differs. Rank 0 (the
trainer) broadcasts the buckets of the plan (see plan.py); the engines receive them.

Rendezvous: the trainer hosts the group's TCPStore, which listens on all interfaces
(torch's store server binds the wildcard address whatever host it is given), and
advertises `RLFLEET_WEIGHT_SYNC_HOST` to the engines in InitWeightTransfer (it must be
routable from the rollout nodes, e.g. the trainer node's hostname that the SLURM job
exports; default 127.0.0.1 for local runs) with `RLFLEET_WEIGHT_SYNC_PORT` (default 0: the
store binds a free port itself and advertises the one it got, so no port is picked and then
re-bound). Forming the group is tried `attempts` times with doubling backoff.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
from rlfleet_proto.v1 import rollout_pb2

from rlfleet_weights.base import (
    GroupReceiver,
    IncomingWeights,
    WeightPublish,
    WeightRequestError,
    WeightSender,
)
from rlfleet_weights.plan import (
    BucketPlan,
    copy_into,
    direct_view,
    pack_bucket,
    plan_buckets,
    specs_of,
    staging_buffer,
    unpack_bucket,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

HOST_ENV = "RLFLEET_WEIGHT_SYNC_HOST"
"""Address the trainer's weight-group store is reached at (advertised to the engines)."""
PORT_ENV = "RLFLEET_WEIGHT_SYNC_PORT"
"""Port of that store; unset or 0 = a free port the store binds itself."""

DEFAULT_BUCKET_BYTES = 256 << 20
"""Bucket size when an UpdateWeights request leaves `bucket_bytes` at 0."""


@dataclass(frozen=True)
class GroupSpec:
    """How to form a weight group: rendezvous, size, backend, this member's rank."""

    master_address: str
    master_port: int
    world_size: int
    rank: int
    backend: str = "gloo"
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend ({self.backend!r}) must be 'gloo' or 'nccl'")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank ({self.rank}) must be in [0, world_size={self.world_size})")


class WeightGroup:
    """A process group used only for weights; rank 0 (the trainer) broadcasts.

    Built from a TCPStore directly, so that neither the trainer's nor the engine's
    default process group is touched. Rank 0 hosts the store. Forming the group blocks
    until all `world_size` members joined (or `timeout_s` passes).
    """

    def __init__(self, spec: GroupSpec, store: Any = None) -> None:
        import torch
        import torch.distributed as dist

        self.spec = spec
        timeout = timedelta(seconds=spec.timeout_s)
        self.store = store if store is not None else host_store(spec)
        prefix = dist.PrefixStore("rlfleet-weights", self.store)  # type: ignore[attr-defined]
        self.device: Any
        self.pg: Any
        if spec.backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefix, spec.rank, spec.world_size, timeout)
            self.device = torch.device("cpu")
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefix, spec.rank, spec.world_size, options)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.staging: list[Any] = [None, None]
        """Receive buffers reused across updates (see receive_weights)."""
        self.send_staging: list[Any] = [None, None]
        """Pack buffers reused across updates (see send_weights)."""
        # One tiny collective proves every member is connected before weights move.
        probe = torch.zeros(1, device=self.device)
        self.pg.broadcast(probe, 0).wait()
        if spec.backend == "gloo":
            _OPEN_GROUPS.add(self)

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.pg.broadcast(tensor, 0).wait()

    def close(self) -> None:
        """Release the group. A gloo group left to the interpreter's exit can abort the
        process ("terminate called without an active exception": its threads are torn
        down in no set order), so gloo groups are shut down here and, if still open, at
        exit. NCCL groups are only dropped: their shutdown waits for the peers and held a
        trainer's exit for minutes on GPUs while the engines kept theirs."""
        pg, self.pg = self.pg, None
        _OPEN_GROUPS.discard(self)
        if pg is not None and self.spec.backend == "gloo":
            try:
                pg.shutdown()
            except RuntimeError as exc:  # already aborted by a failed peer
                logger.debug("weight group shutdown: %s", exc)


_OPEN_GROUPS: weakref.WeakSet[WeightGroup] = weakref.WeakSet()


@atexit.register
def _close_open_groups() -> None:
    for group in list(_OPEN_GROUPS):
        group.close()


def host_store(spec: GroupSpec) -> Any:
    """The group's TCPStore: hosted by rank 0 (port 0 = a free one, see `.port`), joined
    by the others."""
    import torch.distributed as dist

    return dist.TCPStore(  # type: ignore[attr-defined]
        spec.master_address,
        spec.master_port,
        spec.world_size,
        is_master=spec.rank == 0,
        timeout=timedelta(seconds=spec.timeout_s),
        wait_for_workers=False,
    )


def rendezvous_endpoint(env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) of the trainer's weight-group store from RLFLEET_WEIGHT_SYNC_HOST/PORT."""
    env = os.environ if env is None else env
    host = env.get(HOST_ENV, "").strip() or "127.0.0.1"
    raw = env.get(PORT_ENV, "").strip() or "0"
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ValueError(f"{PORT_ENV} ({raw!r}) must be a port number in [0, 65535]")
    return host, port


def send_weights(
    group: WeightGroup, state_dict: Mapping[str, torch.Tensor], bucket_bytes: int
) -> float:
    """Rank 0 side: broadcast `state_dict` bucket by bucket; returns bytes/s sent.

    Double-buffered: bucket k+1 is packed while bucket k is on the wire, so packing
    costs no transfer time once the first bucket is out (at most two buckets in memory).
    A bucket whose tensors already lie in one piece of memory at the plan's offsets (a
    lone contiguous tensor, or a flat buffer) goes out from there, with no pack copy; the
    others are packed into two buffers kept on the group and reused across updates.
    """
    plan = plan_buckets(specs_of(state_dict), bucket_bytes)
    start = time.perf_counter()
    in_flight: Any = None
    for index, bucket in enumerate(plan.buckets):
        flat = direct_view(bucket, state_dict, group.device)
        if flat is None:
            staging = staging_buffer(group.send_staging, index % 2, bucket.nbytes, group.device)
            flat = pack_bucket(bucket, state_dict, out=staging)
        work = group.pg.broadcast(flat, 0)
        if in_flight is not None:
            in_flight[0].wait()
        in_flight = (work, flat)
    if in_flight is not None:
        in_flight[0].wait()
    elapsed = time.perf_counter() - start
    return plan.total_bytes / elapsed if elapsed > 0 else float("inf")


def receive_weights_into(
    group: WeightGroup, plan: BucketPlan, targets: Mapping[str, torch.Tensor]
) -> tuple[int, float]:
    """Receive `plan` straight into `targets` (e.g. a live model's parameters): a bucket
    whose tensors lie in place (a lone tensor; packed buckets after `home_buckets`)
    lands in the target's memory, any other goes through a reused staging buffer and is
    copied out while the next bucket is in flight. Returns (bytes, seconds copying)."""
    import torch

    copy_s = 0.0
    pending: Any = None

    def finish(item: Any) -> float:
        work, bucket, flat, direct = item
        work.wait()
        if direct:
            return 0.0
        t0 = time.perf_counter()
        with torch.no_grad():
            for name, view in unpack_bucket(bucket, flat):
                copy_into(targets[name], view)
        return time.perf_counter() - t0

    for index, bucket in enumerate(plan.buckets):
        flat = direct_view(bucket, targets, group.device)
        direct = flat is not None
        if flat is None:
            flat = staging_buffer(group.staging, index % 2, bucket.nbytes, group.device)
        work = group.pg.broadcast(flat, 0)
        if pending is not None:
            copy_s += finish(pending)
        pending = (work, bucket, flat, direct)
    if pending is not None:
        copy_s += finish(pending)
    return plan.total_bytes, copy_s


def receive_weights(
    group: WeightGroup, plan: BucketPlan, *, reuse_buffers: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Receiver side: yields `(name, tensor)` bucket by bucket. The receive of bucket k+1
    is posted before bucket k is handed out, so the consumer's copies overlap the transfer.

    reuse_buffers=False: a fresh buffer per bucket (yielded tensors stay valid; collect
    them freely). True: two staging buffers kept on the group and reused across updates
    (no page faults after the first update, ~75 ms per 100 MB on this VM), but a yielded
    tensor is only valid until the next one is requested: copy it right away.
    """
    import torch

    def buffer(index: int, nbytes: int) -> torch.Tensor:
        if not reuse_buffers:
            return torch.empty(nbytes, dtype=torch.uint8, device=group.device)
        slot = index % 2
        current: torch.Tensor | None = group.staging[slot]
        if current is None or current.numel() < nbytes:
            current = torch.empty(nbytes, dtype=torch.uint8, device=group.device)
            group.staging[slot] = current
        return current[:nbytes]

    pending: Any = None
    for index, bucket in enumerate(plan.buckets):
        flat = buffer(index, bucket.nbytes)
        work = group.pg.broadcast(flat, 0)
        if pending is not None:
            pending[0].wait()
            yield from unpack_bucket(pending[1], pending[2])
        pending = (work, bucket, flat)
    if pending is not None:
        pending[0].wait()
        yield from unpack_bucket(pending[1], pending[2])


class CollectiveSender(WeightSender):
    """UpdateWeights(GLOO/NCCL) with the tensor list; the buckets go by broadcast from
    rank 0 (this process) to every engine worker of the rollout service."""

    def __init__(
        self,
        stub: Any,
        bucket_bytes: int,
        backend: str,
        timeout_s: float = 120.0,
        *,
        endpoint: tuple[str, int] | None = None,
        attempts: int = 3,
        backoff_s: float = 1.0,
    ) -> None:
        super().__init__(stub, bucket_bytes)
        self.backend = backend
        self.timeout_s = timeout_s
        self.endpoint = endpoint if endpoint is not None else rendezvous_endpoint()
        """(advertised host, port) of the store; see the module docstring."""
        self.attempts = max(1, attempts)
        self.backoff_s = backoff_s
        self.group: WeightGroup | None = None
        self.transport = (
            rollout_pb2.WEIGHT_TRANSPORT_NCCL
            if backend == "nccl"
            else rollout_pb2.WEIGHT_TRANSPORT_GLOO
        )

    async def init(self) -> None:
        """Form the trainer(rank 0)↔engine group: our store is bound first (its real port
        is the one advertised), then InitWeightTransfer and our side of the rendezvous run
        concurrently (each blocks until the other joins). Tried `attempts` times."""
        host, port = self.endpoint
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                self.group = await self._form_group(host, port)
                # Which address the engines were told (and joined): what an operator
                # checks first when a cross-node group does not form.
                logger.info(
                    "weight group (%s) formed at %s:%d with %d engine workers",
                    self.backend, host, self.group.spec.master_port,
                    self.group.spec.world_size - 1,
                )  # fmt: skip
                return
            except (grpc.RpcError, RuntimeError, OSError) as exc:  # RPC, store, group timeout
                if attempt == self.attempts:
                    raise RuntimeError(
                        f"weight group at {host}:{port or '(free port)'} not formed after "
                        f"{self.attempts} tries: {exc}; the rollout nodes must reach {host} "
                        f"(set {HOST_ENV} to the trainer node's routable address)"
                    ) from exc
                logger.warning(
                    "weight group at %s:%s: %s; try %d of %d in %.1fs",
                    host, port, exc, attempt, self.attempts, delay,
                )  # fmt: skip
                await asyncio.sleep(delay)
                delay *= 2

    async def _form_group(self, host: str, port: int) -> WeightGroup:
        status = await self.stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30.0)
        workers = max(int(status.num_replicas), 1)
        spec = GroupSpec(host, port, 1 + workers, 0, self.backend, self.timeout_s)
        store = await asyncio.to_thread(host_store, spec)
        spec = GroupSpec(host, int(store.port), 1 + workers, 0, self.backend, self.timeout_s)
        request = rollout_pb2.InitWeightTransferRequest(
            transport=self.transport,
            master_address=host,
            master_port=spec.master_port,
            world_size=1 + workers,
            rank_offset=1,
            timeout_s=self.timeout_s,
        )
        group_task = asyncio.create_task(asyncio.to_thread(WeightGroup, spec, store))
        try:
            await self.stub.InitWeightTransfer(request, timeout=self.timeout_s + 10)
        except BaseException:
            # Our side gives up by itself after timeout_s; its error is not news.
            group_task.add_done_callback(lambda t: t.cancelled() or t.exception())
            raise
        return await group_task

    async def publish(
        self, update: WeightPublish, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> rollout_pb2.UpdateWeightsResponse:
        if self.group is None:
            raise RuntimeError("CollectiveSender.publish before init (no weight group)")
        state = {name: t.detach().contiguous() for name, t in tensors}
        request = rollout_pb2.UpdateWeightsRequest(
            weight_version=update.version,
            transport=self.transport,
            tensors=specs_of(state),
            bucket_bytes=self.bucket_bytes,
            recompute_kv_cache=update.recompute_kv_cache,
        )
        call: asyncio.Future[rollout_pb2.UpdateWeightsResponse] = asyncio.ensure_future(
            self.stub.UpdateWeights(request, timeout=600.0)
        )
        await asyncio.to_thread(send_weights, self.group, state, self.bucket_bytes)
        reply: rollout_pb2.UpdateWeightsResponse = await call
        return reply

    async def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


class CollectiveReceiver(GroupReceiver):
    """The engine's member of the weight group (`backend` gloo or nccl). `receive` turns
    UpdateWeights(GLOO/NCCL) into the bucket plan; the engine then receives the buckets
    with `receive_into` (into its own parameters) or `receive_tensors`."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.group: WeightGroup | None = None

    def receive(self, request: rollout_pb2.UpdateWeightsRequest) -> IncomingWeights:
        if not request.tensors:
            raise WeightRequestError("tensors", "must list the tensors to receive, in send order")
        try:
            plan = plan_buckets(request.tensors, request.bucket_bytes or DEFAULT_BUCKET_BYTES)
        except ValueError as exc:
            raise WeightRequestError("tensors", str(exc)) from None
        return IncomingWeights(plan=plan)

    def join(
        self, master_address: str, master_port: int, world_size: int, rank: int, timeout_s: float
    ) -> None:
        self.close()
        spec = GroupSpec(master_address, master_port, world_size, rank, self.backend, timeout_s)
        self.group = WeightGroup(spec)

    @property
    def joined(self) -> bool:
        return self.group is not None

    def _group(self) -> WeightGroup:
        if self.group is None:
            raise RuntimeError("no weight group: call InitWeightTransfer first")
        return self.group

    def receive_into(
        self, plan: BucketPlan, targets: Mapping[str, torch.Tensor]
    ) -> tuple[int, float]:
        return receive_weights_into(self._group(), plan, targets)

    def receive_tensors(self, plan: BucketPlan) -> Iterator[tuple[str, torch.Tensor]]:
        return receive_weights(self._group(), plan)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None
