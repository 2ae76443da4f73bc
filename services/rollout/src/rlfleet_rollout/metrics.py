"""Prometheus metrics of the rollout service (defined in docs/rollout.md)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from rlfleet_core.metrics import REGISTRY

from rlfleet_rollout.types import Sample, UpdateResult

SAMPLES = Counter(
    "rlfleet_rollout_samples",
    "Samples generated, by the face that asked (grpc, http) and finish reason.",
    ["face", "finish_reason"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "rlfleet_rollout_generated_tokens", "Tokens generated (all samples).", registry=REGISTRY
)
WEIGHT_VERSION = Gauge(
    "rlfleet_rollout_weight_version", "Weight version being served.", registry=REGISTRY
)
UPDATE_SECONDS = Histogram(
    "rlfleet_rollout_weight_update_seconds",
    "Wall time of a weight update (transfer + apply).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
UPDATE_BYTES = Counter(
    "rlfleet_rollout_weight_update_bytes", "Bytes of weights received.", registry=REGISTRY
)


def record_sample(sample: Sample, face: str) -> None:
    SAMPLES.labels(face, sample.finish_reason.value).inc()
    TOKENS.inc(len(sample.token_ids))


def record_update(result: UpdateResult) -> None:
    WEIGHT_VERSION.set(result.version)
    UPDATE_SECONDS.observe(result.transfer_time_s + result.apply_time_s)
    UPDATE_BYTES.inc(result.bytes_received)
