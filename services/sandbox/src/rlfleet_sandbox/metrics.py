"""Prometheus metrics of the sandbox service (defined in the README's metrics table)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from rlfleet_core.metrics import REGISTRY

EXECUTIONS = Counter(
    "rlfleet_sandbox_executions",
    "Runs finished, by language, mode (oneshot | session) and status.",
    ["language", "mode", "status"],
    registry=REGISTRY,
)
EXECUTION_SECONDS = Histogram(
    "rlfleet_sandbox_execution_seconds",
    "Wall time of runs as the service saw them (queueing included), by mode.",
    ["mode"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
POOL_IDLE = Gauge(
    "rlfleet_sandbox_pool_idle",
    "Warm one-shot sandboxes ready for a run.",
    registry=REGISTRY,
)
POOL_WAITING = Gauge(
    "rlfleet_sandbox_pool_waiting",
    "Runs waiting for a free warm sandbox.",
    registry=REGISTRY,
)
SPAWNS = Counter(
    "rlfleet_sandbox_spawns",
    "Sandboxes started, by mode and result (ok | error).",
    ["mode", "result"],
    registry=REGISTRY,
)
RETIRED = Counter(
    "rlfleet_sandbox_retired",
    "Pooled sandboxes replaced, by reason (max_runs | unhealthy | shutdown).",
    ["reason"],
    registry=REGISTRY,
)
SESSIONS_OPEN = Gauge(
    "rlfleet_sandbox_sessions_open",
    "Stateful sessions open now.",
    registry=REGISTRY,
)
SESSIONS_CLOSED = Counter(
    "rlfleet_sandbox_sessions_closed",
    "Sessions closed, by reason (client | idle | shutdown).",
    ["reason"],
    registry=REGISTRY,
)
SESSION_RESETS = Counter(
    "rlfleet_sandbox_session_resets",
    "Session sandboxes that died mid-cell (killed past the deadline, crashed) and lost their state.",
    registry=REGISTRY,
)
