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
pool refuses a stale version before touching any replica.

Trade-offs (see docs/rollout.md): Ray adds a few seconds of start-up and a hop per
sample (~1 ms); with one replica the engine runs in the service process instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import check_newer
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
        from rlfleet_rollout.engines import build_engine

        single = config.model_copy(update={"replicas": 1})
        self.engine = build_engine(single, Path(model_path))
        self.engine_replica = f"{config.engine}-{index}"
        self.engine.replica = self.engine_replica  # type: ignore[attr-defined]

    async def start(self) -> dict[str, Any]:
        await self.engine.start()
        return {
            "vocab_size": self.engine.vocab_size,
            "max_model_len": self.engine.max_model_len,
            "eos_token_ids": self.engine.eos_token_ids,
        }

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


class ReplicaPool:
    def __init__(self, config: RolloutServiceConfig, model_path: Path) -> None:
        self.config = config
        self.model_path = model_path
        self.name: str = config.engine
        self._version = 0
        self._load: list[int] = []
        self._actors: list[Any] = []
        self._info: dict[str, Any] = {}
        self._statuses: list[EngineStatus] = []
        self._update_lock = asyncio.Lock()
        self._owns_ray = False
        self._poller: asyncio.Task[None] | None = None
        self.status_interval_s = 0.5
        self.tokenizer: Any = None

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return int(self._info["vocab_size"])

    @property
    def max_model_len(self) -> int:
        return int(self._info["max_model_len"])

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self._info["eos_token_ids"])

    async def start(self) -> None:
        import ray
        import torch

        if not ray.is_initialized():
            await asyncio.to_thread(
                ray.init,
                num_cpus=self.config.ray_num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
            self._owns_ray = True
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
        infos = await asyncio.gather(*(a.start.remote() for a in self._actors))
        self._info = infos[0]
        self._load = [0] * len(self._actors)
        from transformers import AutoTokenizer

        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_path)
        self._poller = asyncio.create_task(self._poll_status())
        logger.info("replica pool ready: %d x %s", len(self._actors), self.name)

    async def stop(self) -> None:
        import ray

        if self._poller is not None:
            self._poller.cancel()
        if self._actors:
            await asyncio.gather(*(a.stop.remote() for a in self._actors), return_exceptions=True)
            for actor in self._actors:
                ray.kill(actor)
            self._actors = []
        if self._owns_ray:
            await asyncio.to_thread(ray.shutdown)

    def _pick(self) -> int:
        return min(range(len(self._actors)), key=lambda i: self._load[i])

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
                await actor.abort.remote(request.request_id)

    async def abort(self, request_id: str) -> None:
        await asyncio.gather(*(a.abort.remote(request_id) for a in self._actors))

    async def pause(self, mode: PauseMode) -> int:
        counts = await asyncio.gather(*(a.pause.remote(mode) for a in self._actors))
        return int(sum(counts))

    async def resume(self) -> None:
        await asyncio.gather(*(a.resume.remote() for a in self._actors))

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
        import ray

        async with self._update_lock:
            # Replicas would each refuse a stale version too, but checking here first
            # keeps them in step (no replica updated while another refused).
            check_newer(update.version, self._version)
            if update.tensors is not None:
                ref = ray.put(update.tensors)
                header = WeightUpdate(update.version, recompute_kv_cache=update.recompute_kv_cache)
                results = await asyncio.gather(
                    *(a.update_weights.remote(header, ref) for a in self._actors)
                )
            else:
                results = await asyncio.gather(
                    *(a.update_weights.remote(update) for a in self._actors)
                )
            self._version = update.version
            return UpdateResult(
                update.version,
                results[0].bytes_received,
                max(r.transfer_time_s for r in results),
                max(r.apply_time_s for r in results),
            )

    async def _poll_status(self) -> None:
        while True:
            try:
                self._statuses = list(
                    await asyncio.gather(*(a.status.remote() for a in self._actors))
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
            num_replicas=len(self._actors),
        )
