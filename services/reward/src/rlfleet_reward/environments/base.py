"""What an environment is, and the row-field helpers every environment uses.

An environment has two halves that run in different places:
- `parse_row` runs in the gateway process on every request. It checks the row's fields
  and returns a small picklable spec, so a malformed row is refused with INVALID_ARGUMENT
  before it costs a worker any time.
- `score` runs where the environment's `placement` says (config `placement.<env>` overrides
  it; rlfleet_reward/placement.py): `process`, a verifier worker (CPU work, killable on
  timeout); `thread`, a bounded thread pool; `loop`, inline on the gateway's event loop
  under a wall-clock guard, for sub-millisecond checks. Environments whose work is I/O
  (the `code` env waits on the sandbox; the judge environments wait on the judge:
  environments/judged.py) or that wrap another environment (`low_effort`) override `run`
  instead and stay in the gateway's event loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Protocol

from rlfleet_reward.types import RowError, Sample, Score

Placement = Literal["loop", "thread", "process"]
PLACEMENTS: tuple[str, ...] = ("loop", "thread", "process")


class RunContext(Protocol):
    """What the gateway lends an environment for one call."""

    timeout_s: float
    """Time left for this verification (already capped by the call's deadline)."""

    async def run_in_pool(self, env: str, spec: Any, sample: Sample) -> Score:
        """Score `sample` with environment `env`'s `score` in a worker process."""

    async def verify(self, env: str, spec: Any, sample: Sample) -> Score:
        """Score with environment `env`'s `score` where its placement says."""

    async def run_env(self, env: str, spec: Any, sample: Sample) -> Score:
        """Score with another environment, wherever it runs (for wrappers)."""

    def sandbox(self) -> Any:
        """The sandbox client (rlfleet_contracts.sandbox_client.SandboxClient), or None."""

    def judge(self) -> Any:
        """The gateway's judge client (rlfleet_reward.judge.client.JudgeClient), or None
        when `judge.base_url` is not set. For environments that override `run` (on the
        gateway's loop): environments/judged.py."""


class Environment:
    """Base class of every environment; subclasses set the class attributes and
    implement `parse_row` and either `score` (worker) or `run` (gateway)."""

    name: ClassVar[str]
    description: ClassVar[str]
    required_fields: ClassVar[tuple[str, ...]] = ()
    optional_fields: ClassVar[tuple[str, ...]] = ()
    group_aware: ClassVar[bool] = False
    needs_num_tokens: ClassVar[bool] = False
    """True when `Sample.num_tokens` must be set (length-aware rewards)."""
    preload_modules: ClassVar[tuple[str, ...]] = ()
    """Heavy libraries `score` imports; the pool imports them once in its forkserver so
    that every worker (and every replacement of a killed one) starts warm."""
    placement: ClassVar[Placement] = "process"
    """Where `score` runs unless config `placement.<env>` says otherwise: `loop` (inline,
    sub-ms checks whose C calls are bounded), `thread`, or `process` (anything unbounded).
    Chosen from the measured cost per answer (docs/reward.md)."""

    def warm(self) -> None:
        """Load what `parse_row` needs before the first request (called at service start),
        and, for an environment that may run on the loop, whatever `score` initialises
        lazily: the inline guard can interrupt a first call midway, and a library left
        half-initialised stays so for the life of the process."""

    def parse_row(self, row: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    def score(self, spec: Any, sample: Sample) -> Score:
        """The check itself, called where `placement` says (a worker, a thread or the loop)."""
        raise NotImplementedError(f"{self.name} scores in the gateway, not in a worker")

    async def run(self, spec: Any, sample: Sample, ctx: RunContext) -> Score:
        return await ctx.verify(self.name, spec, sample)


# --- row field helpers: each raises RowError naming the field ---------------------------


def require(row: Mapping[str, Any], key: str) -> Any:
    if key not in row or row[key] is None:
        raise RowError(key, "required, but missing")
    return row[key]


def require_str(row: Mapping[str, Any], key: str, *, allow_empty: bool = False) -> str:
    value = require(row, key)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise RowError(key, f"expected a string, got {type(value).__name__}")
    text = str(value)
    if not allow_empty and not text.strip():
        raise RowError(key, "must not be empty")
    return text


def optional_str(row: Mapping[str, Any], key: str, default: str) -> str:
    if row.get(key) is None:
        return default
    return require_str(row, key)


def optional_number(
    row: Mapping[str, Any],
    key: str,
    default: float,
    *,
    low: float | None = None,
    high: float | None = None,
) -> float:
    value = row.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RowError(key, f"expected a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise RowError(key, f"must be within [{low}, {high}], got {value}")
    return float(value)


def optional_bool(row: Mapping[str, Any], key: str, default: bool) -> bool:
    value = row.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RowError(key, f"expected true or false, got {value!r}")
    return value


def choice(row: Mapping[str, Any], key: str, options: tuple[str, ...], default: str) -> str:
    value = optional_str(row, key, default)
    if value not in options:
        raise RowError(key, f"must be one of {', '.join(options)}; got {value!r}")
    return value
