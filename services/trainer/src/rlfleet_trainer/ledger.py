"""The prompt ledger: proof that every prompt of a run was trained on, or dropped with a
reason, exactly once — across crashes and resumes.

It is an append-only JSONL file (`ledger.jsonl` in the run folder), one line per prompt
outcome: `{"prompt_id", "outcome": "trained" | "dropped", "reason", "step"}`. A step's
lines are appended and fsync'ed *before* that step's checkpoint is written, and each
checkpoint records the ledger's byte length. Resuming truncates the ledger back to that
length, so outcomes of steps after the checkpoint (which will be redone) disappear, and
outcomes up to it are kept. Hence after any crash: ledger = outcomes of steps ≤ the
resumed checkpoint + outcomes of the steps run since — never a duplicate, never a gap.

Drop reasons: `stale` (older than max_trajectory_age_steps), `zero_variance` (dynamic
sampling), `generation_failed`, `reward_failed`, `prompt_too_long`, `run_ended` (in
flight or buffered when the last step finished).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DROP_REASONS = (
    "stale",
    "zero_variance",
    "generation_failed",
    "reward_failed",
    "prompt_too_long",
    "run_ended",
)


@dataclass(frozen=True)
class LedgerEntry:
    prompt_id: str
    outcome: str
    """`trained` or `dropped`."""
    reason: str = ""
    step: int = 0


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)

    def append(self, entries: Sequence[LedgerEntry]) -> int:
        """Append and fsync; returns the ledger's byte length afterwards."""
        for entry in entries:
            if entry.outcome not in ("trained", "dropped"):
                raise ValueError(
                    f"ledger outcome must be trained or dropped, got {entry.outcome!r}"
                )
            if entry.outcome == "dropped" and entry.reason not in DROP_REASONS:
                raise ValueError(
                    f"drop reason {entry.reason!r} unknown; valid: {', '.join(DROP_REASONS)}"
                )
        lines = "".join(json.dumps(entry.__dict__, sort_keys=True) + "\n" for entry in entries)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())
            return f.tell()

    def size(self) -> int:
        return self.path.stat().st_size

    def truncate(self, length: int) -> None:
        """Forget everything after byte `length` (the resumed checkpoint's ledger size)."""
        size = self.size()
        if length > size:
            # Growing the file would pad it with NUL bytes and hide that entries are gone.
            raise ValueError(
                f"ledger {self.path} has {size} bytes but the checkpoint recorded {length}: "
                "entries the checkpoint counts are missing; restore the ledger or start the "
                "stage again without --resume"
            )
        with self.path.open("r+b") as f:
            f.truncate(length)
            f.flush()
            os.fsync(f.fileno())

    def entries(self) -> list[LedgerEntry]:
        with self.path.open(encoding="utf-8") as f:
            return [LedgerEntry(**json.loads(line)) for line in f if line.strip()]


def verify_ledger(
    entries: Iterable[LedgerEntry], issued_prompt_ids: Iterable[str]
) -> dict[str, int]:
    """Check that each issued prompt appears exactly once and nothing else appears.

    Raises AssertionError naming the duplicated, missing and unknown ids; returns counts
    per outcome/reason ("trained", "dropped/stale", ...) otherwise.
    """
    entries = list(entries)
    seen = Counter(entry.prompt_id for entry in entries)
    issued = list(issued_prompt_ids)
    duplicated = sorted(pid for pid, count in seen.items() if count > 1)
    missing = sorted(set(issued) - set(seen))
    unknown = sorted(set(seen) - set(issued))
    if duplicated or missing or unknown:
        raise AssertionError(
            f"ledger broken: duplicated={duplicated[:10]} ({len(duplicated)}), "
            f"missing={missing[:10]} ({len(missing)}), unknown={unknown[:10]} ({len(unknown)})"
        )
    counts: Counter[str] = Counter()
    for entry in entries:
        counts["trained" if entry.outcome == "trained" else f"dropped/{entry.reason}"] += 1
    return dict(counts)
