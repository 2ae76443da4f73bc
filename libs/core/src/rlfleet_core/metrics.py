"""Prometheus metrics shared by every service (names are defined once, here)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# One registry per process; services add their own metrics to it.
REGISTRY = CollectorRegistry(auto_describe=True)

GRPC_REQUESTS = Counter(
    "rlfleet_grpc_requests",
    "gRPC calls handled, by method and final status code.",
    ["service", "method", "code"],
    registry=REGISTRY,
)
GRPC_LATENCY = Histogram(
    "rlfleet_grpc_request_seconds",
    "Wall time of gRPC calls, by method.",
    ["service", "method"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
GRPC_IN_FLIGHT = Gauge(
    "rlfleet_grpc_in_flight",
    "gRPC calls being handled now.",
    ["service"],
    registry=REGISTRY,
)
