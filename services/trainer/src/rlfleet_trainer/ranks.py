"""Several trainer ranks: the process group, the batch slice of each rank, and the driver's
commands to the other ranks.

Roles: global rank 0 is the *driver*. It alone talks to rollout and reward and runs the
collector, ledger, metrics, validation and checkpoint commits (`loop.run_grpo`, unchanged).
Its policy backend is wrapped in `DriverBackend`, which before each collective backend call
broadcasts a command (`train` with the full batch, `hf_state_dict`, `save`, `load`,
`export_hf`, `stop`) to the other ranks. Those *followers* (`follow`) build the same backend,
open no service connection and run each command as it comes, until `stop`. A plain process
wraps its backend in `SingleRankBackend`; both are a `TrainerBackend`, which is all the loop
sees.

Each rank trains on `rank_slice(batch, data_parallel_rank, data_parallel_size)`: contiguous
slices, the first `N mod size` ranks one sample more (like numpy.array_split), every slice
padded to the same row count with rows whose loss mask is 0, so all ranks run the same
number of micro-batches (FSDP gathers parameters collectively in every forward). The loss
normaliser is the global batch's (the backend all-reduces it), so the summed gradient equals
one process's on the whole batch.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from rlfleet_contracts.recipe import GRPOConfig

from rlfleet_trainer.algorithms.dpo import TrainLoss
from rlfleet_trainer.backends.base import PolicyBackend
from rlfleet_trainer.batch import TrainBatch
from rlfleet_trainer.faults import crash_hook

logger = logging.getLogger(__name__)

TIMEOUT_ENV = "RLFLEET_TRAINER_COLLECTIVE_TIMEOUT_S"
"""Seconds a collective may wait (default 3600): followers wait in a broadcast while the
driver generates a step, so this bounds the longest generation phase."""

RENDEZVOUS_ATTEMPTS = 5
RENDEZVOUS_BACKOFF_S = 2.0
RENDEZVOUS_TIMEOUT_S = 600.0
"""How long a rank waits for the store and for the other ranks to join (starting N
processes that import torch and load a model can take minutes on a loaded machine)."""


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_driver(self) -> bool:
        return self.rank == 0


def env_rank_info(env: dict[str, str] | None = None) -> RankInfo:
    """RANK, WORLD_SIZE, LOCAL_RANK as torchrun exports them (srun scripts export the same
    from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID); unset = one plain process."""
    env = dict(os.environ if env is None else env)
    try:
        info = RankInfo(
            int(env.get("RANK", "0")),
            int(env.get("WORLD_SIZE", "1")),
            int(env.get("LOCAL_RANK", "0")),
        )
    except ValueError as exc:
        raise ValueError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers: {exc}") from None
    if info.world_size < 1 or not 0 <= info.rank < info.world_size:
        raise ValueError(f"RANK={info.rank} is not in [0, WORLD_SIZE={info.world_size})")
    return info


def init_distributed(
    attempts: int = RENDEZVOUS_ATTEMPTS,
    backoff_s: float = RENDEZVOUS_BACKOFF_S,
    timeout_s: float = RENDEZVOUS_TIMEOUT_S,
) -> RankInfo:
    """Join the default process group from the launcher's environment (gloo on CPU, nccl on
    GPU). Reaching the rendezvous store is tried `attempts` times with doubling backoff (a
    rank may start before the one hosting the store); the group itself is formed once: if
    that fails every rank must start over together, which is torchrun's restart, not a
    retry here (ranks retrying on their own would wait for each other forever). A world of
    one without a launcher creates no group (the plain process of today)."""
    info = env_rank_info()
    if info.world_size == 1 or dist.is_initialized():
        return info
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ValueError(
            f"WORLD_SIZE={info.world_size} but {', '.join(missing)} is not set: launch with "
            "torchrun (or export the rendezvous address like deploy/slurm does)"
        )
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(info.local_rank)
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    store = _rendezvous_store(info, where, attempts, backoff_s, timeout_s)
    try:
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=store,
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except (RuntimeError, ValueError, OSError) as exc:
        raise RuntimeError(
            f"trainer rank {info.rank}: forming the process group at {where} (world size "
            f"{info.world_size}) failed: {exc}"
        ) from exc
    _set_timeout(datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "3600"))))
    return info


def bind_threads_to_device(loop: asyncio.AbstractEventLoop) -> None:
    """Make the loop's worker threads (asyncio.to_thread: the backend's train, gather and
    the followers' command loop run there) use this rank's GPU. CUDA's current device is
    per thread and a new thread starts on device 0, so without this every rank's
    collectives ran on GPU 0 (NCCL: "Duplicate GPU detected: rank 0 and rank 1 both on
    CUDA device", seen on 2x H100)."""
    if not torch.cuda.is_available():
        return
    device = torch.cuda.current_device()
    loop.set_default_executor(
        ThreadPoolExecutor(
            thread_name_prefix=f"trainer-cuda{device}",
            initializer=torch.cuda.set_device,
            initargs=(device,),
        )
    )


def _rendezvous_store(
    info: RankInfo, where: str, attempts: int, backoff_s: float, timeout_s: float
) -> Any:
    """The TCPStore at MASTER_ADDR:MASTER_PORT: torchrun's agent hosts it
    (TORCHELASTIC_USE_AGENT_STORE); otherwise (srun) rank 0 does. Keys live under the
    launcher's attempt, so a restarted group never reads the dead one's addresses."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    hosting = info.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                host,
                port,
                info.world_size,
                is_master=hosting,
                timeout=datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
            break
        except (RuntimeError, ValueError, OSError) as exc:  # DistNetworkError, DistStoreError
            if attempt == attempts:
                raise RuntimeError(
                    f"trainer rank {info.rank}: rendezvous at {where} failed {attempts} times "
                    f"(world size {info.world_size}): {exc}"
                ) from exc
            logger.warning(
                "rendezvous at %s: %s; try %d of %d in %.1fs", where, exc, attempt, attempts, delay
            )
            time.sleep(delay)
            delay *= 2
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"/worker/attempt_{restart}", store)  # type: ignore[attr-defined]


def _set_timeout(timeout: datetime.timedelta) -> None:
    """Later collectives wait up to `timeout` (followers idle while the driver generates)."""
    try:
        dist.distributed_c10d._set_pg_timeout(timeout)
    except (AttributeError, RuntimeError) as exc:  # older torch: keep the rendezvous timeout
        logger.warning("cannot raise the collective timeout: %s", exc)


def rank_slice(batch: TrainBatch, rank: int, size: int) -> TrainBatch:
    """This data-parallel rank's contiguous slice, padded to ⌈N/size⌉ rows with copies of
    row 0 whose loss mask and advantage are 0 (they add nothing to loss or normaliser)."""
    if size == 1:
        return batch
    n = batch.size
    rows = -(-n // size)
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    pad = rows - (stop - start)
    index = torch.cat([torch.arange(start, stop), torch.zeros(pad, dtype=torch.long)])
    real = torch.cat([torch.ones(stop - start), torch.zeros(pad)])

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[index]

    return replace(
        batch,
        input_ids_NL=batch.input_ids_NL[index],
        attention_mask_NL=batch.attention_mask_NL[index],
        mask_NT=batch.mask_NT[index] * real[:, None].to(batch.mask_NT.dtype),
        generation_logprobs_NT=batch.generation_logprobs_NT[index],
        advantages_N=batch.advantages_N[index] * real.to(batch.advantages_N.dtype),
        prev_logprobs_NT=take(batch.prev_logprobs_NT),
        reference_logprobs_NT=take(batch.reference_logprobs_NT),
        weight_versions_N=batch.weight_versions_N[index]
        if batch.weight_versions_N.numel() == n
        else batch.weight_versions_N,
    )


def train_slice(
    backend: PolicyBackend, batch: TrainBatch, grpo: GRPOConfig
) -> tuple[dict[str, float], dict[str, float]]:
    """prev/reference logprobs (when needed), then one optimizer step of the `grpo` loss,
    on this rank's slice."""
    part = rank_slice(
        batch,
        getattr(backend, "data_parallel_rank", 0),
        getattr(backend, "data_parallel_size", 1),
    )
    timings: dict[str, float] = {}
    started = time.monotonic()
    if not grpo.force_on_policy_ratio:
        part.prev_logprobs_NT = backend.logprobs(part)
    if grpo.kl_coef > 0:
        part.reference_logprobs_NT = backend.logprobs(part, reference=True)
    timings["logprobs_s"] = time.monotonic() - started
    started = time.monotonic()
    metrics = backend.train_step(part, grpo)
    timings["train_s"] = time.monotonic() - started
    return metrics, timings


def _broadcast(command: Any = None) -> Any:
    box = [command]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class TrainerBackend(PolicyBackend, Protocol):
    """The policy as the stage's loop drives it on global rank 0: a whole GRPO step
    (`train`, on every rank's slice) and `stop` (the other ranks may end) besides the
    backend's own calls. `SingleRankBackend` (one process) and `DriverBackend` (several
    ranks) implement it, so the loop never asks which one it holds."""

    def train(
        self, batch: TrainBatch, grpo: GRPOConfig
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One GRPO step on the whole `batch`: (metrics, timings)."""
        ...

    def stop(self) -> None:
        """The stage is done (only on success: after an error torchrun ends the others)."""
        ...


class SingleRankBackend:
    """One process: `train` is this rank's step on the whole batch, `stop` has no one to
    tell; every backend call goes straight to `inner` (a DPO stage trains through them)."""

    def __init__(self, backend: PolicyBackend) -> None:
        self.inner = backend
        self.data_parallel_rank = getattr(backend, "data_parallel_rank", 0)
        self.data_parallel_size = getattr(backend, "data_parallel_size", 1)

    def train(
        self, batch: TrainBatch, grpo: GRPOConfig
    ) -> tuple[dict[str, float], dict[str, float]]:
        return train_slice(self.inner, batch, grpo)

    def stop(self) -> None:
        pass

    def logprobs(self, batch: TrainBatch, *, reference: bool = False) -> torch.Tensor:
        return self.inner.logprobs(batch, reference=reference)

    def train_step(self, batch: TrainBatch, loss_config: TrainLoss) -> dict[str, float]:
        return self.inner.train_step(batch, loss_config)

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self.inner.hf_state_dict()

    def save(self, path: Path) -> None:
        self.inner.save(path)

    def load(self, path: Path) -> None:
        self.inner.load(path)

    def export_hf(self, path: Path) -> None:
        self.inner.export_hf(path)


class DriverBackend:
    """The driver's view of the policy when several ranks train: each collective call is
    announced to the followers (a broadcast command) and then run here too. With no
    process group it is a pass-through (but for the per-rank `logprobs` / `train_step`)."""

    def __init__(self, backend: PolicyBackend) -> None:
        self.inner = backend
        self.data_parallel_rank = getattr(backend, "data_parallel_rank", 0)
        self.data_parallel_size = getattr(backend, "data_parallel_size", 1)
        self.distributed = dist.is_initialized() and dist.get_world_size() > 1

    def _announce(self, *command: Any) -> None:
        if self.distributed:
            _broadcast(command)

    def train(
        self, batch: TrainBatch, grpo: GRPOConfig
    ) -> tuple[dict[str, float], dict[str, float]]:
        self._announce("train", batch, grpo)
        return train_slice(self.inner, batch, grpo)

    def logprobs(self, batch: TrainBatch, *, reference: bool = False) -> torch.Tensor:
        raise RuntimeError("DriverBackend scores through train(); logprobs is per rank")

    def train_step(self, batch: TrainBatch, loss_config: TrainLoss) -> dict[str, float]:
        raise RuntimeError("DriverBackend trains through train(); train_step is per rank")

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._announce("hf_state_dict")
        return self.inner.hf_state_dict()

    def save(self, path: Path) -> None:
        self._announce("save", str(path))
        self.inner.save(path)
        self.barrier()  # every rank's shards are on disk before the commit

    def load(self, path: Path) -> None:
        self._announce("load", str(path))
        self.inner.load(path)

    def export_hf(self, path: Path) -> None:
        self._announce("export_hf", str(path))
        self.inner.export_hf(path)
        self.barrier()

    def stop(self) -> None:
        self._announce("stop")

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def follow(backend: PolicyBackend, rank: int) -> int:
    """A follower rank: run the driver's commands until `stop`; returns commands run."""
    done = 0
    step = 0
    while True:
        command = _broadcast()
        kind = command[0]
        if kind == "stop":
            return done
        if kind == "train":
            train_slice(backend, command[1], command[2])
            step += 1
            crash_hook("after_train", step, rank)
        elif kind == "hf_state_dict":
            for _ in backend.hf_state_dict():
                pass
        elif kind == "save":
            backend.save(Path(command[1]))
            crash_hook("checkpoint_saved", step, rank)
            dist.barrier()
        elif kind == "load":
            backend.load(Path(command[1]))
            step = int(Path(command[1]).parent.name.removeprefix("step_"))
        elif kind == "export_hf":
            backend.export_hf(Path(command[1]))
            dist.barrier()
        else:
            raise RuntimeError(f"unknown driver command {kind!r}")
        done += 1
