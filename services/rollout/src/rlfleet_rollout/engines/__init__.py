"""Generation engines behind one interface (`Engine`); `build_engine` picks one."""

from __future__ import annotations

from pathlib import Path

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import Engine


def build_engine(config: RolloutServiceConfig, model_path: Path) -> Engine:
    """The configured engine (imports lazily: vllm is absent on some machines, and
    importing it costs ~10 s)."""
    if config.replicas > 1:
        from rlfleet_rollout.engines.pool import ReplicaPool

        return ReplicaPool(config, model_path)
    if config.engine == "vllm":
        from rlfleet_rollout.engines.vllm import VllmEngine

        return VllmEngine(config, model_path)
    if config.engine == "hf":
        from rlfleet_rollout.engines.hf import HfEngine

        return HfEngine(config, model_path)
    if config.engine == "scripted":
        from rlfleet_rollout.engines.scripted import ScriptedEngine

        return ScriptedEngine(config, model_path)
    raise ValueError(f"engine {config.engine!r}: valid engines are vllm, hf, scripted")


__all__ = ["Engine", "build_engine"]
