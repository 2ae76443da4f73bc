"""Checkpoint atomicity and the ledger's bookkeeping, in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlfleet_trainer.checkpoint import (
    TrainerState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rlfleet_trainer.ledger import Ledger, LedgerEntry, verify_ledger


class _Backend:
    """Minimal PolicyBackend: one tensor as the whole model."""

    def __init__(self) -> None:
        self.weight = torch.zeros(3)

    def save(self, path: Path) -> None:
        torch.save(self.weight, path / "w.pt")

    def load(self, path: Path) -> None:
        self.weight = torch.load(path / "w.pt")


class _Crash(Exception):
    pass


def test_interrupted_checkpoint_leaves_previous_one(tmp_path: Path) -> None:
    backend = _Backend()
    save_checkpoint(tmp_path, TrainerState(step=1, data_cursor=5), backend, keep_last=2)  # type: ignore[arg-type]
    backend.weight += 1

    def crash(point: str) -> None:
        raise _Crash(point)

    with pytest.raises(_Crash, match="checkpoint_before_rename"):
        save_checkpoint(tmp_path, TrainerState(step=2), backend, keep_last=2, crash_hook=crash)  # type: ignore[arg-type]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1"]
    state = load_checkpoint(latest_checkpoint(tmp_path), backend)  # type: ignore[arg-type]
    assert state.step == 1 and state.data_cursor == 5
    assert torch.equal(backend.weight, torch.zeros(3))
    # the next save cleans the half-written folder and prunes to keep_last
    for step in (2, 3, 4):
        save_checkpoint(tmp_path, TrainerState(step=step), backend, keep_last=2)  # type: ignore[arg-type]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_3", "step_4"]
    assert not list(tmp_path.glob(".tmp-*"))


def test_rng_state_restored(tmp_path: Path) -> None:
    backend = _Backend()
    torch.manual_seed(3)
    save_checkpoint(tmp_path, TrainerState(step=1), backend, keep_last=1)  # type: ignore[arg-type]
    expected = torch.rand(4)
    torch.rand(100)
    load_checkpoint(tmp_path / "step_1", backend)  # type: ignore[arg-type]
    assert torch.equal(torch.rand(4), expected)


def test_ledger_truncation_forgets_unsaved_steps(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    saved = ledger.append([LedgerEntry("a@0", "trained", step=1)])
    ledger.append(
        [LedgerEntry("b@0", "trained", step=2), LedgerEntry("c@0", "dropped", "stale", 2)]
    )
    ledger.truncate(saved)  # resume from the step-1 checkpoint
    ledger.append([LedgerEntry("b@0", "trained", step=2), LedgerEntry("c@0", "trained", step=2)])
    counts = verify_ledger(ledger.entries(), ["a@0", "b@0", "c@0"])
    assert counts == {"trained": 3}


def test_verify_ledger_names_problems(tmp_path: Path) -> None:
    entries = [
        LedgerEntry("a@0", "trained"),
        LedgerEntry("a@0", "dropped", "stale"),
        LedgerEntry("x@0", "trained"),
    ]
    with pytest.raises(
        AssertionError, match=r"duplicated=\['a@0'\].*missing=\['b@0'\].*unknown=\['x@0'\]"
    ):
        verify_ledger(entries, ["a@0", "b@0"])
    with pytest.raises(ValueError, match="drop reason"):
        Ledger(tmp_path / "l.jsonl").append([LedgerEntry("a", "dropped", "bored")])


def test_ledger_shorter_than_the_checkpoint_is_refused(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    saved = ledger.append([LedgerEntry("a@0", "trained", step=1)])
    with pytest.raises(ValueError, match=f"has {saved} bytes but the checkpoint recorded"):
        ledger.truncate(saved + 100)
    # nothing was padded: the file is as it was, with no NUL bytes
    assert ledger.size() == saved
    assert b"\0" not in ledger.path.read_bytes()


def test_resaving_a_step_never_leaves_it_without_a_copy(tmp_path: Path) -> None:
    backend = _Backend()
    save_checkpoint(tmp_path, TrainerState(step=1, data_cursor=5), backend, keep_last=2)  # type: ignore[arg-type]
    backend.weight += 1

    def crash(point: str) -> None:
        if point == "checkpoint_replacing":
            raise _Crash(point)

    # a crash after the old copy was moved aside, before the new one is in place
    with pytest.raises(_Crash, match="checkpoint_replacing"):
        save_checkpoint(
            tmp_path, TrainerState(step=1, data_cursor=7), backend, keep_last=2, crash_hook=crash
        )  # type: ignore[arg-type]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_1"]
    state = load_checkpoint(latest_checkpoint(tmp_path), backend)  # type: ignore[arg-type]
    assert state.data_cursor == 5 and torch.equal(backend.weight, torch.zeros(3))
    assert not list(tmp_path.glob(".old-*"))
    # without a crash the step is replaced and nothing is left aside
    backend.weight += 1
    save_checkpoint(tmp_path, TrainerState(step=1, data_cursor=9), backend, keep_last=2)  # type: ignore[arg-type]
    assert load_checkpoint(latest_checkpoint(tmp_path), backend).data_cursor == 9  # type: ignore[arg-type]
    assert not list(tmp_path.glob(".old-*")) and not list(tmp_path.glob(".tmp-*"))


def test_checkpoint_files_load_without_running_code(tmp_path: Path) -> None:
    """A pickle that would run code on load is refused: checkpoints load with
    `weights_only=True`, so a checkpoint folder is not a code-execution boundary."""
    backend = _Backend()
    path = save_checkpoint(tmp_path, TrainerState(step=1), backend, keep_last=1)  # type: ignore[arg-type]
    torch.load(path / "rng.pt", weights_only=True)  # what we write loads in the safe mode

    class _Payload:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (print, ("pwned",))

    torch.save(_Payload(), path / "rng.pt")
    with pytest.raises(Exception, match=r"[Ww]eights only load failed"):
        load_checkpoint(path, backend)  # type: ignore[arg-type]


_FULL_DISK_CHILD = """
import sys, torch
from pathlib import Path
from rlfleet_trainer.checkpoint import CheckpointDiskFull, TrainerState, save_checkpoint

class Backend:
    def save(self, path):
        torch.save(torch.ones(1 << 20), path / "w.pt")  # 4 MiB into a 1 MiB disk

try:
    save_checkpoint(Path(sys.argv[1]), TrainerState(step=3), Backend(), keep_last=1)
except CheckpointDiskFull as exc:
    print("DISK FULL:", exc)
    print("LEFT:", sorted(p.name for p in Path(sys.argv[1]).iterdir()))
"""


def test_full_disk_is_named_not_a_torch_zip_error(tmp_path: Path) -> None:
    """A full disk made torch.save fail with "unexpected pos N vs M" (seen in a fresh
    container): the error now says the disk is full and where, and no half-written
    checkpoint is left. The disk is a real 1 MiB tmpfs (bubblewrap mount namespace)."""
    import shutil
    import subprocess
    import sys

    if not shutil.which("bwrap"):
        pytest.skip("needs bubblewrap (README prerequisites)")
    disk = tmp_path / "ckpt"
    disk.mkdir()
    bwrap = ["bwrap", "--dev-bind", "/", "/", "--size", str(1 << 20), "--tmpfs", str(disk)]
    proc = subprocess.run(
        [*bwrap, sys.executable, "-c", _FULL_DISK_CHILD, str(disk)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DISK FULL: writing checkpoint step_3 under" in proc.stdout, proc.stdout
    assert "the disk is full" in proc.stdout and "--out" in proc.stdout
    assert "LEFT: []" in proc.stdout, proc.stdout  # the temporary folder is gone
