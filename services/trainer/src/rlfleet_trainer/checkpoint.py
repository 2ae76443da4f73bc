"""Atomic checkpoints of a GRPO run.

Layout of `<dir>/step_<n>/`:
    policy/               the backend's save() (model.safetensors, optimizer.pt; with
                          several ranks each rank's shards, see backends/base.py)
    trainer_state.json    step, weight version, data cursor, ledger length, collector
                          state (prompt indices in flight), replay buffer, metrics
    rng.pt                Python, NumPy and torch (CPU + CUDA) generator states

A checkpoint is written into `<dir>/.tmp-step_<n>-<pid>/`, fsync'ed, then renamed to
`step_<n>` (rename is atomic on POSIX), so a `step_*` folder is always complete: a kill at
any moment leaves either the old set of checkpoints or the old set plus the new one.
Leftover `.tmp-*` folders are removed when the next checkpoint is written.
With several trainer ranks only rank 0 runs this; `backend.save` (a `ranks.DriverBackend`)
has every rank write its shards into the temporary folder and waits for all of them
(barrier) before this function commits it.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlfleet_trainer.backends.base import PolicyBackend

STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    step: int = 0
    weight_version: int = 0
    data_cursor: int = 0
    ledger_bytes: int = 0
    collector: dict[str, Any] = field(default_factory=dict)
    replay_buffer: list[dict[str, Any]] = field(default_factory=list)
    last_metrics: dict[str, float] = field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    """Every generator's state in types `torch.load(weights_only=True)` reads back (numpy's
    key array as a tensor): a checkpoint folder must not be able to run code on load."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy form: (name, keys, pos, gauss, cached)
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached_gaussian],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Below this much free space after a failed write, the failure is taken to be a full disk.
DISK_FULL_BYTES = 64 * 2**20


class CheckpointDiskFull(RuntimeError):
    """A checkpoint could not be written because its disk is full (one line for the user)."""


def save_checkpoint(
    directory: Path,
    state: TrainerState,
    backend: PolicyBackend,
    keep_last: int,
    crash_hook: Any = None,
) -> Path:
    """Write step_<state.step> atomically and prune older checkpoints beyond `keep_last`."""
    directory.mkdir(parents=True, exist_ok=True)
    _recover(directory)
    for leftover in directory.glob(".tmp-step_*"):
        shutil.rmtree(leftover, ignore_errors=True)
    final = directory / f"step_{state.step}"
    tmp = directory / f".tmp-step_{state.step}-{os.getpid()}"
    try:
        (tmp / "policy").mkdir(parents=True)
        backend.save(tmp / "policy")
        (tmp / STATE_FILE).write_text(json.dumps(state.__dict__, sort_keys=True))
        torch.save(rng_state(), tmp / "rng.pt")
        _fsync_tree(tmp)
    except (OSError, RuntimeError) as exc:
        free = shutil.disk_usage(directory).free
        shutil.rmtree(tmp, ignore_errors=True)
        # torch.save reports a full disk as "unexpected pos N vs M": say what it was.
        if getattr(exc, "errno", None) == errno.ENOSPC or free < DISK_FULL_BYTES:
            raise CheckpointDiskFull(
                f"writing checkpoint step_{state.step} under {directory} failed: the disk is "
                f"full ({free / 2**20:.0f} MiB free; {exc}). Free space on that disk or give "
                "the run a larger one (`rlfleet rl --out DIR`); `rlfleet doctor` checks it"
            ) from exc
        raise
    if crash_hook is not None:
        crash_hook("checkpoint_before_rename")
    replaced = None
    if final.exists():  # the same step saved again (e.g. SaveCheckpoint at the end)
        # Moved aside, not deleted, until the new copy is in place: a crash in between
        # leaves the old copy for `_recover` to put back, never no copy at all.
        replaced = directory / f".old-{final.name}-{os.getpid()}"
        final.rename(replaced)
        if crash_hook is not None:
            crash_hook("checkpoint_replacing")
    tmp.rename(final)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
    for old in list_checkpoints(directory)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _recover(directory: Path) -> None:
    """Put back a checkpoint that a crash left moved aside (`.old-step_N-<pid>`) while the
    same step was being saved again; drop it if the new copy made it into place."""
    for aside in directory.glob(".old-step_*"):
        final = directory / aside.name.removeprefix(".old-").rsplit("-", 1)[0]
        if final.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.rename(final)


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not directory.is_dir():
        return []
    _recover(directory)
    found = [p for p in directory.glob("step_*") if p.is_dir() and (p / STATE_FILE).exists()]
    return sorted(found, key=lambda p: int(p.name.split("_", 1)[1]))


def latest_checkpoint(directory: Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def load_checkpoint(path: Path, backend: PolicyBackend) -> TrainerState:
    """Restore model, optimizer and RNG; returns the trainer state to continue from."""
    backend.load(path / "policy")
    set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    return TrainerState(**json.loads((path / STATE_FILE).read_text()))
