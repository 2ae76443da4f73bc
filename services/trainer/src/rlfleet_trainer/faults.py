"""Fault hooks of the kill -9 / resume and Ctrl-C tests: environment variables that make a
trainer rank die, fail or wait at a named point of a step. Unset (every real run), each
hook returns at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CRASH_ENV = "RLFLEET_TRAINER_CRASH_AT"
"""Test hook: `<point>:<step>[:<rank>]` kills that trainer rank (default 0, the driver)
with SIGKILL at that point of that step, in the launcher's first attempt only (a rank that
torchrun restarts runs on). Driver points: after_train, after_ledger,
checkpoint_before_rename, after_checkpoint, after_publish; follower points: after_train,
checkpoint_saved. Used by the kill -9 / resume tests."""


HOLD_ENV = "RLFLEET_TRAINER_HOLD_AT"
"""Test hook: `<stage folder name>:after_checkpoint:<step>` makes that stage's trainer sleep
right after that checkpoint until a signal ends it (at most 10 minutes). Used by the
Ctrl-C / resume test to interrupt a stage at a known step, however fast the machine."""


def crash_hook(point: str, step: int, rank: int | None = None) -> None:
    wanted = os.environ.get(CRASH_ENV, "")
    if not wanted or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0:
        return
    rank = int(os.environ.get("RANK", "0") or 0) if rank is None else rank
    raise_instead = wanted.startswith("raise:")
    wanted = wanted.removeprefix("raise:")
    if wanted in (f"{point}:{step}:{rank}", *((f"{point}:{step}",) if rank == 0 else ())):
        if raise_instead:  # a rank that fails with an error rather than dying
            raise RuntimeError(f"test crash at {point} of step {step} on rank {rank}")
        print(f"test crash: SIGKILL at {point} of step {step} on rank {rank}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def hold_hook(run_dir: Path, point: str, step: int) -> None:
    wanted = os.environ.get(HOLD_ENV, "")
    if wanted and wanted == f"{run_dir.name}:{point}:{step}":
        time.sleep(600)
