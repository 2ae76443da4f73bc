"""Several engine replicas as Ray actors behind one `Engine`, with load balancing.

Each replica is an async Ray actor that owns one engine (hf or vllm) on its own GPUs
(`num_gpus` per replica when CUDA is present). A request goes whole (all `n` samples)
to the replica with the fewest samples in flight: a GRPO group shares its prompt, so
keeping it on one replica keeps its prefix cache hits. Samples stream back through Ray's
streaming generators as they finish.

Weights reach every replica: over the weight group each replica's workers join at
consecutive ranks (replica i at `rank_offset + i`, one worker per replica), and all
replicas receive the same broadcast; tensors that came over gRPC are put in Ray's
object store once and every replica loads them from there. Versions move together: the
pool refuses a stale version before touching any replica, bounds each replica's update
by `update_timeout_s`, and takes a replica that a failed update left on another version
out of rotation (`num_replicas` in GetStatus counts the replicas in rotation).

Trade-offs (see docs/rollout.md): Ray adds start-up time and a hop per sample (~1 ms);
with one replica the engine runs in the service process instead. Every wait on the
replicas has a deadline (`ray_start_timeout_s`, `ray_call_timeout_s`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rlfleet_core.errors import Unavailable
from rlfleet_core.raycluster import as_future

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import EngineBase
from rlfleet_rollout.engines.updates import UpdateAborted, check_newer
from rlfleet_rollout.types import (
    EngineStatus,
    GenerateInput,
    PauseMode,
    Sample,
    TransferGroup,
    UpdateResult,
    WeightUpdate,
)

logger = logging.getLogger(__name__)


class ReplicaActor:
    """Body of a Ray actor holding one engine (made a Ray actor class lazily)."""

    def __init__(self, config: RolloutServiceConfig, model_path: str, index: int) -> None:
        from rlfleet_rollout.engines.single import build_single_engine

        self.engine = build_single_engine(config, Path(model_path))
        self.engine_replica = f"{config.engine}-{index}"
        self.engine.replica = self.engine_replica  # type: ignore[attr-defined]

    async def start(self) -> dict[str, Any]:
        await self.engine.start()
        return {"vocab_size": self.engine.vocab_size, "eos_token_ids": self.engine.eos_token_ids}

    async def generate(self, request: GenerateInput) -> AsyncIterator[Sample]:
        async for sample in self.engine.generate(request):
            yield sample

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def pause(self, mode: PauseMode) -> int:
        return await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()

    async def init_weight_transfer(self, group: TransferGroup) -> int:
        return await self.engine.init_weight_transfer(group)

    async def update_weights(
        self, update: WeightUpdate, tensors: dict[str, Any] | None = None
    ) -> UpdateResult:
        """`tensors` comes as a separate argument so that Ray resolves the object-store
        reference the pool passes (it resolves only top-level arguments)."""
        if tensors is not None:
            update = WeightUpdate(
                update.version, tensors=tensors, recompute_kv_cache=update.recompute_kv_cache
            )
        return await self.engine.update_weights(update)

    async def status(self) -> EngineStatus:
        return self.engine.status()

    async def stop(self) -> None:
        await self.engine.stop()


class ReplicaPool(EngineBase):
    def __init__(self, config: RolloutServiceConfig, model_path: Path) -> None:
        super().__init__(config, model_path)
        self.name = config.engine
        self._load: list[int] = []
        self._actors: list[Any] = []
        self._statuses: list[EngineStatus] = []
        self._update_lock = asyncio.Lock()
        self._fenced: set[int] = set()
        """Replicas out of rotation: left on another version by a failed update."""
        self._owns_ray = False
        self._ray_up = False
        self._started: list[bool] = []
        self._poller: asyncio.Task[None] | None = None
        self.status_interval_s = 0.5

    async def start(self) -> None:
        """Start Ray (when not running yet) and the replicas, within
        `ray_start_timeout_s`: past it, or when a replica fails to load, everything
        started so far is torn down and the error names the replicas concerned."""
        deadline = self.config.ray_start_timeout_s
        try:
            await asyncio.wait_for(self._start(), deadline)
        except BaseException as exc:
            pending = [i for i, done in enumerate(self._started) if not done]
            await self._teardown()
            if isinstance(exc, TimeoutError):
                raise RuntimeError(
                    f"replica pool did not start within ray_start_timeout_s={deadline:g}s "
                    f"(Ray {'up' if self._ray_up else 'not up'}; replicas still loading: "
                    f"{pending or 'none'})"
                ) from None
            raise

    async def _start(self) -> None:
        from rlfleet_core.raycluster import RayConfig, connect

        t0 = time.perf_counter()
        # connect: Ray's workers stay on this interpreter, ray.init retried on Ray's own
        # fixed raylet wait; an already running Ray (tests, a driver) is reused.
        self._owns_ray = await connect(
            RayConfig(
                address="local",
                num_cpus=self.config.ray_num_cpus,
                start_timeout_s=self.config.ray_start_timeout_s,
            )
        )
        import ray
        import torch

        self._ray_up = True
        t1 = time.perf_counter()
        gpus = 1 if torch.cuda.is_available() else 0
        # Async actor: many generate streams at once; no CPU reserved, so a 2-core host
        # can hold several replicas (the engines themselves use the cores).
        actor_cls = ray.remote(ReplicaActor).options(
            num_cpus=0, num_gpus=gpus, max_concurrency=1000
        )
        self._actors = [
            actor_cls.remote(self.config, str(self.model_path), i)
            for i in range(self.config.replicas)
        ]
        self._started = [False] * len(self._actors)

        async def start_one(index: int) -> dict[str, Any]:
            info: dict[str, Any] = await self._actors[index].start.remote()
            self._started[index] = True
            return info

        infos = await asyncio.gather(*(start_one(i) for i in range(len(self._actors))))
        # The replicas load one model with one config (max_model_len included): the first
        # one's token facts are the pool's.
        self._vocab_size = int(infos[0]["vocab_size"])
        self._eos = tuple(infos[0]["eos_token_ids"])
        self._load = [0] * len(self._actors)
        from transformers import AutoTokenizer

        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_path)
        self._poller = asyncio.create_task(self._poll_status())
        logger.info(
            "replica pool ready: %d x %s (Ray up in %.1f s, replicas loaded in %.1f s)",
            len(self._actors),
            self.name,
            t1 - t0,
            time.perf_counter() - t1,
        )

    async def stop(self) -> None:
        await self._teardown()

    async def _teardown(self) -> None:
        """Stop the replicas (each within `ray_call_timeout_s`, then killed) and the Ray
        this pool started. Safe to call twice and after a failed start."""
        import ray

        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        if self._actors:
            timeout = self.config.ray_call_timeout_s
            await asyncio.gather(
                *(asyncio.wait_for(as_future(a.stop.remote()), timeout) for a in self._actors),
                return_exceptions=True,
            )
            for actor in self._actors:
                ray.kill(actor)
            self._actors = []
        if self._owns_ray:
            self._owns_ray = False
            from rlfleet_core.raycluster import shutdown

            await shutdown(True)  # also stops the private Ray head connect started

    def _pick(self) -> int:
        serving = [i for i in range(len(self._actors)) if i not in self._fenced]
        if not serving:
            raise Unavailable(
                "every replica is out of rotation after a failed weight update; "
                "a successful update brings them back"
            )
        return min(serving, key=lambda i: self._load[i])

    async def generate(self, request: GenerateInput) -> AsyncIterator[Sample]:
        index = self._pick()
        actor = self._actors[index]
        self._load[index] += request.n
        received = 0
        try:
            stream = actor.generate.options(num_returns="streaming").remote(request)
            async for ref in stream:
                sample: Sample = await ref
                received += 1
                self._load[index] -= 1
                yield sample
        finally:
            self._load[index] -= request.n - received
            if received < request.n:
                await asyncio.wait_for(
                    as_future(actor.abort.remote(request.request_id)),
                    self.config.ray_call_timeout_s,
                )

    async def abort(self, request_id: str) -> None:
        await self._all(a.abort.remote(request_id) for a in self._actors)

    async def pause(self, mode: PauseMode) -> int:
        # WAIT drains requests in flight: bounded by their own deadlines, not ours.
        timeout = None if mode == PauseMode.WAIT else self.config.ray_call_timeout_s
        counts = await self._all((a.pause.remote(mode) for a in self._actors), timeout)
        return int(sum(counts))

    async def resume(self) -> None:
        await self._all(a.resume.remote() for a in self._actors)

    async def _all(self, refs: Any, timeout: float | None = -1.0) -> list[Any]:
        """Await Ray calls on every replica within `ray_call_timeout_s` (None: no limit):
        a TimeoutError instead of an RPC that hangs."""
        limit = self.config.ray_call_timeout_s if timeout == -1.0 else timeout
        futures = [as_future(ref) for ref in refs]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), limit))
        except TimeoutError:
            raise TimeoutError(f"replicas did not answer within {limit:g}s") from None

    async def init_weight_transfer(self, group: TransferGroup) -> int:
        # All replicas must join together: the group forms only when every rank is there.
        joined = await asyncio.gather(
            *(
                a.init_weight_transfer.remote(
                    TransferGroup(
                        backend=group.backend,
                        master_address=group.master_address,
                        master_port=group.master_port,
                        world_size=group.world_size,
                        rank_offset=group.rank_offset + i,
                        timeout_s=group.timeout_s,
                    )
                )
                for i, a in enumerate(self._actors)
            )
        )
        return int(sum(joined))

    async def update_weights(self, update: WeightUpdate) -> UpdateResult:
        """Every replica gets the update, each within `update_timeout_s`. The pool's
        version moves when at least one replica took it; a replica left on another
        version (it failed, or did not answer in time) is taken out of rotation, so no
        request is served by a diverged replica, until a later update lands on it. A
        replica past the deadline is taken out even if it still reports the previous
        version: its update may land later. When none took it, the pool keeps the
        previous version (engines apply an update whole or not at all), replicas that
        failed within the deadline keep serving it, and the first error is raised."""
        import ray

        async with self._update_lock:
            # Replicas would each refuse a stale version too, but checking here first
            # keeps them in step (no replica updated while another refused).
            check_newer(update.version, self._version, self.config.max_weight_version_jump)
            if update.tensors is not None:
                ref = ray.put(update.tensors)
                header = WeightUpdate(update.version, recompute_kv_cache=update.recompute_kv_cache)
                refs = [a.update_weights.remote(header, ref) for a in self._actors]
            else:
                refs = [a.update_weights.remote(update) for a in self._actors]
            limit = self.config.update_timeout_s
            outcomes = await asyncio.gather(
                *(asyncio.wait_for(as_future(r), limit) for r in refs), return_exceptions=True
            )
            results = [o for o in outcomes if isinstance(o, UpdateResult)]
            if results:
                self._version = update.version
            await self._fence(outcomes, update.version)
            if not results:
                error = outcomes[0]
                if isinstance(error, TimeoutError):
                    raise UpdateAborted(
                        f"no replica loaded version {update.version} within "
                        f"update_timeout_s={limit:g}s; the pool stays on version "
                        f"{self._version}, replicas past the deadline are out of rotation "
                        "until a later update lands on them"
                    )
                assert isinstance(error, BaseException)
                raise error
            return UpdateResult(
                update.version,
                results[0].bytes_received,
                max(r.transfer_time_s for r in results),
                max(r.apply_time_s for r in results),
            )

    async def _fence(self, outcomes: list[Any], wanted: int) -> None:
        """Take out of rotation each replica whose update failed and whose version is
        not the pool's (or that cannot say); put back those that caught up. A replica
        past the deadline is taken out whatever it reports: its update goes on (a
        receive in a thread cannot be stopped) and may land after this call."""
        for index, outcome in enumerate(outcomes):
            version: int | None = None
            if isinstance(outcome, UpdateResult):
                version = outcome.version
            elif isinstance(outcome, TimeoutError):
                logger.warning(
                    "replica %d did not load version %d within update_timeout_s", index, wanted
                )
            else:
                try:
                    status = await asyncio.wait_for(
                        as_future(self._actors[index].status.remote()),
                        self.config.ray_call_timeout_s,
                    )
                    version = status.weight_version if status.serving else None
                except Exception:
                    version = None
                logger.warning("replica %d failed to load version %d: %s", index, wanted, outcome)
            if version == self._version:
                self._fenced.discard(index)
            else:
                self._fenced.add(index)
                logger.error(
                    "replica %d is out of rotation: on version %s, the pool serves %d",
                    index,
                    version,
                    self._version,
                )

    async def _poll_status(self) -> None:
        while True:
            try:
                self._statuses = list(
                    await asyncio.wait_for(
                        asyncio.gather(*(as_future(a.status.remote()) for a in self._actors)),
                        self.config.ray_call_timeout_s,
                    )
                )
            except Exception:  # a replica restarting: keep the last known numbers
                logger.debug("replica status poll failed", exc_info=True)
            await asyncio.sleep(self.status_interval_s)

    def status(self) -> EngineStatus:
        """From the last poll (at most `status_interval_s` old): status() must not block."""
        statuses = self._statuses
        total = sum(self._load)
        return EngineStatus(
            weight_version=self._version,
            paused=any(s.paused for s in statuses),
            requests_waiting=sum(s.requests_waiting for s in statuses),
            requests_running=total,
            tokens_per_s=sum(s.tokens_per_s for s in statuses),
            tokens_generated=sum(s.tokens_generated for s in statuses),
            num_replicas=len(self._actors) - len(self._fenced),
            serving=len(self._fenced) < len(self._actors),
        )
