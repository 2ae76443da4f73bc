"""Generation engines behind one interface (`Engine`); `build_engine` picks one."""

from __future__ import annotations

from pathlib import Path

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import Engine
from rlfleet_rollout.engines.single import build_single_engine


def build_engine(config: RolloutServiceConfig, model_path: Path) -> Engine:
    """The configured engine: a pool of Ray actors for `replicas` > 1 (imported lazily:
    Ray costs seconds to import), else one engine here."""
    if config.replicas > 1:
        from rlfleet_rollout.engines.pool import ReplicaPool

        return ReplicaPool(config, model_path)
    return build_single_engine(config, model_path)


__all__ = ["Engine", "build_engine"]
