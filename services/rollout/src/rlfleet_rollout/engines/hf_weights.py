"""Weight updates of the hf engine (`HfWeights`, mixed into `HfEngine`).

Updates land *between* two decode steps: the decode thread holds the model lock for each
forward pass, and an update copies the new tensors under the same lock. Tensors that come
in the request are ready before the lock is taken, so a slow transfer does not stall
generation; a broadcast is received straight into the parameters under the lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch
from rlfleet_core.errors import FailedPrecondition, InvalidArgument
from rlfleet_weights.base import GroupReceiver
from rlfleet_weights.factory import make_group_receiver
from rlfleet_weights.plan import copy_into, home_buckets

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.updates import check_or_drain
from rlfleet_rollout.types import PauseMode, TransferGroup, UpdateResult, WeightUpdate

logger = logging.getLogger(__name__)


class HfWeights:
    """The engine's weight side: joins the weight group, checks and applies updates.
    The state it uses is the engine's (declared here for the type checker)."""

    config: RolloutServiceConfig
    _version: int
    _recompute: bool
    _model_lock: threading.Lock
    _update_lock: asyncio.Lock
    _receiver: GroupReceiver | None
    _homed_plan: Any
    _targets: dict[str, torch.Tensor]

    async def pause(self, mode: PauseMode) -> int:
        raise NotImplementedError

    async def resume(self) -> None:
        raise NotImplementedError

    async def init_weight_transfer(self, group: TransferGroup) -> int:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        receiver = make_group_receiver(group.backend)
        await asyncio.to_thread(
            receiver.join,
            group.master_address,
            group.master_port,
            group.world_size,
            group.rank_offset,
            group.timeout_s,
        )
        self._receiver = receiver
        return 1

    async def update_weights(self, update: WeightUpdate) -> UpdateResult:
        async with self._update_lock:
            start = time.perf_counter()
            await check_or_drain(
                update,
                self._version,
                lambda: asyncio.to_thread(self._drain, update.plan),
                lambda: self._check_names(self._slots(update)),
            )
            drain = not self.config.in_flight_weight_updates
            if drain:
                await self.pause(PauseMode.WAIT)
            try:
                if update.tensors is None:
                    nbytes, copy_s = await asyncio.to_thread(
                        self._receive_into_model,
                        update.plan,
                        update.version,
                        update.recompute_kv_cache,
                    )
                else:
                    nbytes, copy_s = await asyncio.to_thread(
                        self._apply,
                        update.tensors.items(),
                        update.version,
                        update.recompute_kv_cache,
                    )
            finally:
                if drain:
                    await self.resume()
            total = time.perf_counter() - start
            return UpdateResult(update.version, nbytes, total - copy_s, copy_s)

    def _slots(self, update: WeightUpdate) -> list[tuple[str, tuple[int, ...]]]:
        if update.tensors is None:
            self._require_group()
            return [(s.name, s.shape) for b in update.plan.buckets for s in b.slots]
        return [(k, tuple(v.shape)) for k, v in update.tensors.items()]

    def _check_names(self, items: list[tuple[str, tuple[int, ...]]]) -> None:
        for name, shape in items:
            target = self._targets.get(name)
            if target is None:
                raise InvalidArgument("tensors", f"{name!r} is not a weight of this model")
            if tuple(target.shape) != tuple(shape):
                raise InvalidArgument(
                    "tensors", f"{name}: shape {list(shape)} != model's {list(target.shape)}"
                )

    def _require_group(self) -> GroupReceiver:
        if self._receiver is None:
            raise FailedPrecondition("no weight group: call InitWeightTransfer first")
        return self._receiver

    def _receive_into_model(self, plan: Any, version: int, recompute: bool) -> tuple[int, float]:
        """Receive straight into the parameters: no staging copy of the model. The first
        update with a plan moves each packed bucket's parameters into one flat buffer laid
        out as the bucket (`home_buckets`), so from then on every bucket, packed or not,
        lands in place and nothing is copied after the transfer. Decoding waits for the
        model lock during the transfer, as vLLM's engine does during its collective_rpc."""
        receiver = self._require_group()
        t0 = time.perf_counter()
        with self._model_lock:
            t1 = time.perf_counter()
            homed = 0
            if plan != self._homed_plan:
                homed = home_buckets(plan, self._targets)
                self._homed_plan = plan
            t2 = time.perf_counter()
            nbytes, copy_s = receiver.receive_into(plan, self._targets)
            t3 = time.perf_counter()
            self._version = version
            self._recompute = self._recompute or recompute
        logger.debug(
            "weights v%d: lock wait %.1f ms, home %.1f ms (%d buckets), receive %.1f ms "
            "(copy-out %.1f ms)",
            version,
            (t1 - t0) * 1e3,
            (t2 - t1) * 1e3,
            homed,
            (t3 - t2) * 1e3,
            copy_s * 1e3,
        )
        return nbytes, copy_s + (t2 - t1)

    def _drain(self, plan: Any) -> None:
        """Consume a refused update's broadcasts so the sender does not hang."""
        if self._receiver is not None:
            self._receiver.drain(plan)

    def _apply(
        self, tensors: Iterable[tuple[str, torch.Tensor]], version: int, recompute: bool
    ) -> tuple[int, float]:
        """Copy `tensors` into the model between two decode steps; returns (bytes, seconds
        spent copying)."""
        nbytes = 0
        copy_s = 0.0
        with self._model_lock, torch.no_grad():
            for name, value in tensors:
                t0 = time.perf_counter()
                copy_into(self._targets[name], value)
                copy_s += time.perf_counter() - t0
                nbytes += value.numel() * value.element_size()
            self._version = version
            self._recompute = self._recompute or recompute
        return nbytes, copy_s
