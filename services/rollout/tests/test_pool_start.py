"""The replica pool's start: `ray.init` is tried again when Ray's own fixed raylet wait
runs out, within `ray_start_timeout_s`, and not for other errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


class _FlakyRay:
    """Stands in for the `ray` module: `init` fails `failures` times the way Ray does when
    its raylet misses the hard-coded 30 s registration wait."""

    def __init__(
        self, failures: int, message: str = "The current node timed out during startup."
    ) -> None:
        self.failures = failures
        self.message = message
        self.calls: list[str] = []

    def init(self, **kwargs: Any) -> None:
        self.calls.append("init")
        if self.failures:
            self.failures -= 1
            raise Exception(self.message)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _pool(ray_start_timeout_s: float) -> Any:
    from pathlib import Path

    from rlfleet_rollout.config import RolloutServiceConfig
    from rlfleet_rollout.engines.pool import ReplicaPool

    config = RolloutServiceConfig(engine="hf", replicas=2, ray_start_timeout_s=ray_start_timeout_s)
    return ReplicaPool(config, Path("unused"))


def test_ray_init_is_tried_again_after_raylet_registration_timeout() -> None:
    ray = _FlakyRay(failures=1)
    asyncio.run(_pool(120)._init_ray(ray))
    assert ray.calls == ["init", "shutdown", "init"]


def test_ray_init_other_errors_and_spent_deadline_are_not_retried() -> None:
    other = _FlakyRay(failures=1, message="bad num_cpus")
    with pytest.raises(Exception, match="bad num_cpus"):
        asyncio.run(_pool(120)._init_ray(other))
    assert other.calls == ["init", "shutdown"]
    short = _FlakyRay(failures=5)
    with pytest.raises(Exception, match="timed out during startup"):
        asyncio.run(_pool(5)._init_ray(short))
    assert short.calls == ["init", "shutdown"]
