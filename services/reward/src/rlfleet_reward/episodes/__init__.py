"""The registry of multi-turn environments (episodes), beside the single-turn one.

A multi-turn environment keeps state between the policy's turns: OpenEpisode makes it
from the row, Step runs tool calls against it, CloseEpisode verifies the end state
(base.py says what an environment implements; manager.py holds the episodes). Names live
in their own namespace: `tool_use` here is the multi-turn tool-use world, not the
single-turn `tool_use` of `Score`. Adding one = a module with an `EpisodeEnvironment`
subclass + one line here (+ its row fields in the service README).
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlfleet_reward.episodes.base import EpisodeEnvironment

_REGISTRY: dict[str, str] = {
    "tool_use": "rlfleet_reward.episodes.accounts:AccountsEnvironment",
    "math_python": "rlfleet_reward.episodes.math_python:MathPythonEnvironment",
    "terminal": "rlfleet_reward.episodes.terminal:TerminalEnvironment",
    "swe_agent": "rlfleet_reward.episodes.swe_agent:SweAgentEnvironment",
}

EPISODE_ENVIRONMENT_NAMES: tuple[str, ...] = tuple(_REGISTRY)


@functools.cache
def get_episode_environment(name: str) -> EpisodeEnvironment:
    """The (stateless, shared) instance of multi-turn environment `name` (KeyError if none)."""
    module_name, _, class_name = _REGISTRY[name].partition(":")
    env: EpisodeEnvironment = getattr(importlib.import_module(module_name), class_name)()
    return env
