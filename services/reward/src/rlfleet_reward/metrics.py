"""Prometheus metrics of the reward gateway (each is defined in the service README)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from rlfleet_core.metrics import REGISTRY

RESULTS = Counter(
    "rlfleet_reward_results",
    "Scored responses, by environment and outcome (`scored` or a failure kind such as `timeout`).",
    ["env", "outcome"],
    registry=REGISTRY,
)
REWARD = Histogram(
    "rlfleet_reward_value",
    "Reward of scored (non-failed) responses, by environment.",
    ["env"],
    buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
    registry=REGISTRY,
)
VERIFY_SECONDS = Histogram(
    "rlfleet_reward_verify_seconds",
    "Time from request to verdict for one response, by environment and placement.",
    ["env", "placement"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
INLINE_OVERRUNS = Counter(
    "rlfleet_reward_inline_overruns",
    "Inline (loop-placed) checks that ran past pool.inline_budget_s and were re-scored in "
    "a worker process, by environment.",
    ["env"],
    registry=REGISTRY,
)
REJECTED = Counter(
    "rlfleet_reward_rejected",
    "Responses refused before scoring, by reason (`invalid`, `overloaded`).",
    ["reason"],
    registry=REGISTRY,
)
POOL_WORKERS = Gauge(
    "rlfleet_reward_pool_workers", "Verifier worker processes running.", registry=REGISTRY
)
POOL_BUSY = Gauge(
    "rlfleet_reward_pool_busy", "Verifier workers scoring a job now.", registry=REGISTRY
)
POOL_QUEUE = Gauge(
    "rlfleet_reward_pool_queue_depth", "Jobs waiting for a verifier worker.", registry=REGISTRY
)
POOL_RESTARTS = Counter(
    "rlfleet_reward_pool_restarts",
    "Verifier workers killed and replaced, by reason (`timeout`, `crash`, `dead`, `protocol`).",
    ["reason"],
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "rlfleet_reward_http_requests",
    "NeMo-Gym /verify requests, by environment and HTTP status.",
    ["env", "status"],
    registry=REGISTRY,
)
EPISODES_OPEN = Gauge(
    "rlfleet_reward_episodes_open", "Multi-turn episodes open now", registry=REGISTRY
)
EPISODES_CLOSED = Counter(
    "rlfleet_reward_episodes_closed",
    "Episodes ended, by environment and how (scored, abandoned, idle)",
    ["env", "how"],
    registry=REGISTRY,
)
TOOL_CALLS = Counter(
    "rlfleet_reward_tool_calls",
    "Tool calls in episodes, by environment and outcome (ok, error)",
    ["env", "outcome"],
    registry=REGISTRY,
)
