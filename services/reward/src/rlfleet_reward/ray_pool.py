"""The verifier pool spread over a Ray cluster (`pool.backend=ray`), for a gateway whose
verification outgrows one node.

Each Ray actor is a node agent that runs the ordinary `VerifierPool` (pool.py) on its
node: `pool.workers` warm worker processes with the same soft and hard timeouts and the
same kill-and-replace. The gateway keeps `RayVerifierPool`, which has `VerifierPool`'s
interface: it bounds the queue, sends each job to the live actor with the fewest jobs in
flight, and bounds each call by the job's budget plus `ray.call_timeout_s`.

A lost actor (its process or node died) is taken out of rotation and the job goes to
another live actor with what is left of its budget; when none is left the caller gets a
VERIFIER_ERROR failure naming the lost workers, never a hang or a silent 0. Lost actors
are not replaced: the service reports `alive` workers and an operator restarts it (or
adds nodes) when too few are left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from rlfleet_core import raycluster
from rlfleet_core.raycluster import RayConfig

from rlfleet_reward import metrics
from rlfleet_reward.pool import VerifierPool
from rlfleet_reward.types import FailureKind, Overloaded, Sample, Score, failure

logger = logging.getLogger(__name__)

_MIN_RETRY_BUDGET_S = 0.05  # less than this left: answer instead of trying another actor


class VerifierNode:
    """Body of one Ray actor: a `VerifierPool` on its node (made a Ray actor class lazily)."""

    def __init__(self, pool_args: dict[str, Any]) -> None:
        self.pool_args = pool_args
        self.pool: VerifierPool | None = None

    async def start(self) -> str:
        self.pool = VerifierPool(**self.pool_args)
        await self.pool.start()
        return raycluster.node_id()

    async def score(self, env: str, spec: Any, sample: Sample, timeout_s: float) -> Score:
        assert self.pool is not None
        return await self.pool.submit(env, spec, sample, timeout_s)

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.stop()


class RayVerifierPool:
    """`VerifierPool`'s interface over `ray.workers` Ray actors of `size` processes each."""

    def __init__(self, ray_config: RayConfig, *, max_queue: int, pool_args: dict[str, Any]):
        self.ray = ray_config
        self.max_queue = max_queue
        self.pool_args = pool_args
        self.size = int(pool_args["size"])
        self._spread = raycluster.SpreadActors(ray_config)
        self._inflight: list[int] = []
        self._lost: set[int] = set()
        self._pending = 0
        self._closed = False
        self.restarts = 0
        self.served: Counter[str] = Counter()
        """Jobs answered per Ray node id (what the tests and operators look at)."""

    @property
    def _actors(self) -> list[Any]:
        return self._spread.actors

    @property
    def _nodes(self) -> list[str]:
        return self._spread.node_ids

    @property
    def alive(self) -> int:
        return len(self._actors) - len(self._lost)

    @property
    def queue_depth(self) -> int:
        return max(0, self._pending - self.alive * self.size)

    async def start(self) -> None:
        """Join Ray, place the actors and start their pools, all within
        `ray.start_timeout_s`; on failure everything started so far is torn down."""
        await self._spread.start(VerifierNode, self.pool_args, what="Ray verifier workers")
        self._inflight = [0] * len(self._actors)
        metrics.POOL_WORKERS.set(self.size * len(self._actors))
        logger.info(
            "Ray verifier pool ready: %d workers x %d processes on %d nodes",
            len(self._actors),
            self.size,
            len(set(self._nodes)),
        )

    async def stop(self) -> None:
        self._closed = True
        await self._teardown()
        metrics.POOL_WORKERS.set(0)

    async def _teardown(self) -> None:
        await self._spread.stop(self._lost)

    def reserve(self, n: int) -> None:
        """Raise Overloaded unless `n` more jobs fit (a group is all or nothing)."""
        if self._closed:
            raise Overloaded("reward service is shutting down")
        if self.queue_depth + n > self.max_queue:
            metrics.REJECTED.labels("overloaded").inc(n)
            raise Overloaded(
                f"verifier queue full ({self.queue_depth} waiting, limit {self.max_queue}); "
                "retry later"
            )

    def _pick(self, tried: set[int]) -> int | None:
        live = [i for i in range(len(self._actors)) if i not in self._lost and i not in tried]
        return min(live, key=lambda i: self._inflight[i]) if live else None

    async def submit(self, env: str, spec: Any, sample: Sample, timeout_s: float) -> Score:
        """Score on a Ray actor; the verdict (or a failure) comes within `timeout_s` plus
        `ray.call_timeout_s`, however many actors are lost meanwhile."""
        self.reserve(1)
        deadline = time.monotonic() + timeout_s
        tried: set[int] = set()
        self._pending += 1
        metrics.POOL_QUEUE.set(self.queue_depth)
        try:
            while True:
                index = self._pick(tried)
                if index is None:
                    return failure(
                        FailureKind.VERIFIER_ERROR,
                        f"no Ray verifier worker left to score {env}: "
                        f"{len(self._lost)} of {len(self._actors)} lost with their nodes",
                    )
                budget = deadline - time.monotonic()
                tried.add(index)
                try:
                    score = await self._call(index, env, spec, sample, budget)
                except _ActorLost as lost:
                    if self._closed:  # stop() kills the actors: not a lost node
                        return failure(FailureKind.OVERLOADED, "reward service is shutting down")
                    if deadline - time.monotonic() < _MIN_RETRY_BUDGET_S:
                        return failure(FailureKind.VERIFIER_ERROR, str(lost))
                    continue
                self.served[self._nodes[index]] += 1
                score.info["ray_node"] = self._nodes[index][:12]
                return score
        finally:
            self._pending -= 1
            metrics.POOL_QUEUE.set(self.queue_depth)

    async def _call(
        self, index: int, env: str, spec: Any, sample: Sample, budget_s: float
    ) -> Score:
        actor = self._actors[index]
        limit = max(0.0, budget_s) + self.ray.call_timeout_s
        self._inflight[index] += 1
        try:
            ref = actor.score.remote(env, spec, sample, budget_s)
            result: Score = await asyncio.wait_for(raycluster.as_future(ref), limit)
            return result
        except TimeoutError:
            return failure(
                FailureKind.TIMEOUT,
                f"{env}: Ray verifier worker on node {self._nodes[index][:12]} did not answer "
                f"within {limit:.2f}s (budget + ray.call_timeout_s)",
            )
        except Exception as exc:
            if not raycluster.is_actor_lost(exc):
                raise
            if index not in self._lost:
                self._lost.add(index)
                self.restarts += 1
                metrics.POOL_RESTARTS.labels("ray_actor_lost").inc()
                metrics.POOL_WORKERS.set(self.size * self.alive)
                logger.error(
                    "Ray verifier worker %d on node %s lost (%s); %d left",
                    index,
                    self._nodes[index][:12],
                    type(exc).__name__,
                    self.alive,
                )
            raise _ActorLost(
                f"{env}: Ray verifier worker on node {self._nodes[index][:12]} was lost "
                f"({type(exc).__name__}) and no time was left to try another"
            ) from None
        finally:
            self._inflight[index] -= 1


class _ActorLost(Exception):
    pass
