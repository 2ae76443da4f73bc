"""The GenRM's throughput as a reward client sees it: judge comparisons per second of
the time a judged ScoreGroup was in flight (the trainer's `genrm/*` metrics).

The reward gateway reports in each result's `info.judge_calls` how many comparisons its
group asked the judge (those answered from the gateway's cache not counted);
`reward_client.RewardClient` records them with the call's start and end. Groups are
scored concurrently, so the busy time is the length of the union of those intervals, not
their sum: comparisons / busy time is the rate the judge kept up while it had work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

JUDGE_CALLS_INFO = "judge_calls"
"""The `info` key of a judged ScoreResult: comparisons its group asked the judge."""


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals (overlaps counted once)."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def judge_calls_of(infos: Iterable[Mapping[str, str]]) -> int | None:
    """A group's judge comparisons from its results' info maps (each carries the group's
    count), or None when the environment asked no judge."""
    for info in infos:
        value = info.get(JUDGE_CALLS_INFO)
        if value is not None:
            return int(value)
    return None


@dataclass
class JudgeTally:
    """Judged ScoreGroup calls since the last `take` (a step's window)."""

    calls: int = 0
    groups: int = 0
    intervals: list[tuple[float, float]] = field(default_factory=list)

    def record(self, calls: int, started: float, ended: float) -> None:
        self.calls += calls
        self.groups += 1
        self.intervals.append((started, ended))

    def take(self) -> dict[str, float]:
        """The window's `genrm/*` metrics (none when no group was judged), then reset.

        - genrm/comparisons: comparisons the judge was asked;
        - genrm/busy_s: seconds some judged ScoreGroup was in flight (union);
        - genrm/comparisons_per_s: comparisons / busy_s.
        """
        if not self.groups:
            return {}
        busy = busy_seconds(self.intervals)
        metrics = {
            "genrm/comparisons": float(self.calls),
            "genrm/busy_s": busy,
            "genrm/comparisons_per_s": self.calls / busy if busy > 0 else 0.0,
        }
        self.calls, self.groups, self.intervals = 0, 0, []
        return metrics
