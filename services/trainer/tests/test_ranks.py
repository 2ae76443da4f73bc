"""Pieces of the multi-rank trainer that need no second process: each rank's slice of a
batch, the launcher environment, and a rendezvous that nobody answers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from rlfleet_trainer.batch import Trajectory, build_train_batch
from rlfleet_trainer.ranks import env_rank_info, rank_slice


def _batch(n: int):  # type: ignore[no-untyped-def]
    trajectories = [
        Trajectory(
            prompt_id=f"p{i}",
            sample_index=0,
            prompt_token_ids=[1, 2],
            token_ids=[3 + i] * (1 + i % 3),
            generation_logprobs=[-0.5] * (1 + i % 3),
            truncated=False,
            reward=float(i),
            env="e",
        )
        for i in range(n)
    ]
    for i, t in enumerate(trajectories):
        t.advantage = float(i + 1)
    return build_train_batch(trajectories, torch.ones(n))


@pytest.mark.parametrize(("n", "size"), [(8, 2), (5, 2), (7, 3), (1, 2), (6, 4)])
def test_slices_cover_the_batch_once_with_equal_row_counts(n: int, size: int) -> None:
    batch = _batch(n)
    parts = [rank_slice(batch, rank, size) for rank in range(size)]
    # every rank runs the same number of rows (FSDP gathers in every forward)
    assert {p.size for p in parts} == {-(-n // size)}
    # the real rows, in order, are the batch; padding rows carry no loss and no count
    real = [i for p in parts for i in range(p.size) if p.mask_NT[i].sum() > 0]
    assert len(real) == n
    advantages = torch.cat([p.advantages_N[p.mask_NT.sum(1) > 0] for p in parts])
    assert advantages.tolist() == batch.advantages_N.tolist()
    assert sum(p.global_valid_tokens() for p in parts) == batch.global_valid_tokens()
    assert sum(p.global_valid_sequences() for p in parts) == batch.global_valid_sequences()
    sizes = [int((p.mask_NT.sum(1) > 0).sum()) for p in parts]
    assert sizes == sorted(sizes, reverse=True) and max(sizes) - min(sizes) <= 1


def test_one_rank_gets_the_batch_itself() -> None:
    batch = _batch(3)
    assert rank_slice(batch, 0, 1) is batch


def test_launcher_environment_is_checked() -> None:
    assert env_rank_info({}).world_size == 1
    info = env_rank_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.is_driver) == (1, 2, 1, False)
    with pytest.raises(ValueError, match="RANK=2 is not in"):
        env_rank_info({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="must be integers"):
        env_rank_info({"RANK": "x", "WORLD_SIZE": "2"})


def _trainer_run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet_trainer", "run", "--run-dir", "/nonexistent/x"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_missing_rendezvous_address_is_one_clear_line() -> None:
    out = _trainer_run({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "", "MASTER_PORT": ""})
    assert out.returncode == 1
    assert "MASTER_ADDR, MASTER_PORT is not set: launch with torchrun" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_unanswered_rendezvous_is_retried_then_named() -> None:
    code = (
        "from rlfleet_trainer.ranks import init_distributed\n"
        "init_distributed(attempts=2, backoff_s=0.1, timeout_s=2)\n"
    )
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **os.environ,
            "RANK": "1",
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert f"trainer rank 1: rendezvous at 127.0.0.1:{port} failed 2 times" in out.stderr
    assert "try 1 of 2" in out.stderr


def test_worker_threads_use_this_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend runs in asyncio.to_thread workers, and CUDA's current device is per
    thread (a new one starts on device 0): on 2x H100 rank 1's follower thread ran its
    collectives on GPU 0 ("Duplicate GPU detected"). Every worker thread of the loop must
    be bound to the rank's device first. torch.cuda is stood in for (CPU machine)."""
    import asyncio
    import threading

    from rlfleet_trainer.ranks import bind_threads_to_device

    bound: dict[str, int] = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(
        torch.cuda, "set_device", lambda d: bound.__setitem__(threading.current_thread().name, d)
    )

    async def main() -> str:
        bind_threads_to_device(asyncio.get_running_loop())
        return await asyncio.to_thread(lambda: threading.current_thread().name)

    worker = asyncio.run(main())
    assert bound.get(worker) == 1, bound
