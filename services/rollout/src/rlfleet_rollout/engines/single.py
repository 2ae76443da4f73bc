"""One engine in this process (vllm, hf or scripted), as `build_engine` makes it for one
replica and each replica of a pool (engines.pool) makes it for itself: a module of its
own so that the pool need not import the package that imports the pool."""

from __future__ import annotations

from pathlib import Path

from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import Engine


def build_single_engine(config: RolloutServiceConfig, model_path: Path) -> Engine:
    """The configured engine (imports lazily: vllm is absent on some machines, and
    importing it costs ~10 s)."""
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
