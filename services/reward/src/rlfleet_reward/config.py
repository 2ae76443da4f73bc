"""Configuration of the reward service (`rlfleet serve reward key=value ...`)."""

from __future__ import annotations

import os

from pydantic import Field, field_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.server import ServiceConfig

from rlfleet_reward.environments import ENVIRONMENT_NAMES


class PoolConfig(ConfigModel):
    """The verifier worker processes (`pool.*`)."""

    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=256)
    """Worker processes scoring CPU-bound environments; default one per core."""
    max_queue: int = Field(4096, ge=1)
    """Jobs that may wait for a worker; beyond this, calls get RESOURCE_EXHAUSTED (HTTP 429)."""
    kill_grace_s: float = Field(1.0, gt=0, le=60)
    """Part of each job's budget kept for the hard stop: the worker's own (signal) timeout
    fires this long before the budget ends, and a worker still silent at the end (stuck
    in C code) is killed and replaced. Budgets under 2x this split in half instead."""
    start_method: str = "forkserver"
    """multiprocessing start method: forkserver (warm, safe beside gRPC threads) or spawn."""

    @field_validator("start_method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value not in ("forkserver", "spawn"):
            raise ValueError(
                f"must be forkserver or spawn, got {value!r} (fork is unsafe beside gRPC threads)"
            )
        return value


class SandboxConfig(ConfigModel):
    """How the `code` environment reaches the sandbox service (`sandbox.*`)."""

    target: str | None = None
    """host:port of rlfleet.v1.SandboxService; None = the code env answers SANDBOX_ERROR."""
    call_overhead_s: float = Field(5.0, gt=0)
    """Deadline of an Execute call = the program's time limit + this (start-up, transfer)."""
    memory_bytes: int = Field(1 << 30, ge=16 << 20)
    """Address-space limit asked for each program."""


class RewardServiceConfig(ServiceConfig):
    """Settings of the reward service (`server.*` is shared by every service)."""

    environments: list[str] = Field(default_factory=lambda: list(ENVIRONMENT_NAMES))
    """Environments served; others are refused as unknown (and their libraries not loaded)."""
    extra_environments: dict[str, str] = Field(default_factory=dict)
    """More environments, name -> "package.module:Class" (an `Environment` subclass);
    they are served in addition to `environments`."""
    timeout_s: float = Field(10.0, gt=0, le=600)
    """Verification budget per response: its verdict or a TIMEOUT failure comes within
    this (queue wait included); a call's own deadline lowers it."""
    env_timeout_s: dict[str, float] = Field(default_factory=lambda: {"code": 60.0})
    """Per-environment budgets that override `timeout_s` (e.g. code runs tests)."""
    max_stream_in_flight: int = Field(256, ge=1)
    """ScoreStream requests of one stream being scored at once; the stream reads no
    further until one finishes (flow control instead of unbounded buffering)."""
    pool: PoolConfig = PoolConfig()
    sandbox: SandboxConfig = SandboxConfig()

    @field_validator("environments")
    @classmethod
    def _known_envs(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in ENVIRONMENT_NAMES]
        if unknown:
            raise ValueError(
                f"unknown environments {unknown}; known: {', '.join(ENVIRONMENT_NAMES)}"
            )
        if not value:
            raise ValueError("must list at least one environment")
        return value
