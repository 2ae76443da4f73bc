"""Weight updates of the hf engine (`HfWeights`, mixed into `HfEngine`).

Updates land *between* two decode steps: the decode thread holds the model lock for each
forward pass, and an update copies the new tensors under the same lock. The new tensors
are complete before the lock is taken (those of the request arrive whole; a broadcast is
received into staging tensors first), so a slow transfer does not stall generation and a
transfer that fails midway changes nothing: the model is never a mix of two versions.
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
from rlfleet_rollout.engines.updates import UpdateAborted, check_or_drain
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
    _staged_plan: Any
    _staging: dict[str, torch.Tensor]
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
                self.config.max_weight_version_jump,
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
        """Receive into staging tensors, then copy them into the model in one step under
        the model lock: a transfer that fails midway (the sender died, the group timed
        out) leaves the model exactly as it was and the version unchanged. The staging
        copy (one model's worth of memory, kept across updates) is laid out as the plan's
        buckets on first use (`home_buckets`), so every bucket lands in place there.
        Decoding goes on during the transfer and waits only for the final copy."""
        receiver = self._require_group()
        staging = self._staging_for(plan)
        t0 = time.perf_counter()
        try:
            nbytes, copy_s = receiver.receive_into(plan, staging)
        except Exception as exc:
            # A broadcast cut short leaves the group out of step with its sender: it
            # cannot carry another update.
            receiver.close()
            self._receiver = None
            raise UpdateAborted(
                f"weight transfer of version {version} failed midway ({exc}); still "
                f"serving version {self._version}; call InitWeightTransfer again"
            ) from None
        t1 = time.perf_counter()
        with self._model_lock, torch.no_grad():
            t2 = time.perf_counter()
            for name in plan.names:
                copy_into(self._targets[name], staging[name])
            t3 = time.perf_counter()
            self._version = version
            self._recompute = self._recompute or recompute
        logger.debug(
            "weights v%d: receive %.1f ms, lock wait %.1f ms, swap in %.1f ms",
            version,
            (t1 - t0) * 1e3,
            (t2 - t1) * 1e3,
            (t3 - t2) * 1e3,
        )
        return nbytes, copy_s + (t3 - t2)

    def _staging_for(self, plan: Any) -> dict[str, torch.Tensor]:
        """Staging tensors for `plan`'s names (tied weights share one), made once per plan."""
        if plan != self._staged_plan:
            by_target: dict[int, torch.Tensor] = {}
            staging = {}
            for name in plan.names:
                target = self._targets[name]
                if id(target) not in by_target:
                    by_target[id(target)] = torch.empty_like(
                        target, memory_format=torch.contiguous_format
                    )
                staging[name] = by_target[id(target)]
            home_buckets(plan, staging)
            self._staging, self._staged_plan = staging, plan
        return self._staging

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
