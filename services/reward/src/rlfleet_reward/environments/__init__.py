"""The environment registry: name -> module and class, imported on first use.

Adding an environment = one module with an `Environment` subclass + one line here (+ its
row fields in the service README). Lazy imports keep the gateway's start fast and let a
worker load only what it scores.
"""

from __future__ import annotations

import functools
import importlib

from rlfleet_reward.environments.base import Environment

_REGISTRY: dict[str, str] = {
    "math": "rlfleet_reward.environments.math:MathEnvironment",
    "mcqa": "rlfleet_reward.environments.mcqa:McqaEnvironment",
    "structured_outputs": "rlfleet_reward.environments.structured_outputs:StructuredOutputsEnvironment",
    "instruction_following": "rlfleet_reward.environments.instruction_following:InstructionFollowingEnvironment",
    "reasoning_gym": "rlfleet_reward.environments.reasoning_gym_env:ReasoningGymEnvironment",
    "code": "rlfleet_reward.environments.code:CodeEnvironment",
    "tool_use": "rlfleet_reward.environments.tool_use:ToolUseEnvironment",
    "low_effort": "rlfleet_reward.environments.low_effort:LowEffortEnvironment",
    "long_context": "rlfleet_reward.environments.long_context:LongContextEnvironment",
    "multi_challenge": "rlfleet_reward.environments.multi_challenge:MultiChallengeEnvironment",
    "math_with_code": "rlfleet_reward.environments.math_with_code:MathWithCodeEnvironment",
    "math_formal_lean": "rlfleet_reward.environments.math_formal_lean:MathFormalLeanEnvironment",
    "swe_pivot": "rlfleet_reward.environments.swe_pivot:SwePivotEnvironment",
    "genrm_compare": "rlfleet_reward.environments.genrm_compare:GenRMCompareEnvironment",
    "safety": "rlfleet_reward.environments.safety:SafetyEnvironment",
    "single_step_tool_use_with_argument_comparison": "rlfleet_reward.environments.tool_argument_comparison:ToolArgumentComparisonEnvironment",
}

ENVIRONMENT_NAMES: tuple[str, ...] = tuple(_REGISTRY)
"""The built-in environments (`register_environment` adds more at run time)."""


class UnknownEnvironment(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.message = f"unknown environment {name!r}; known: {', '.join(ENVIRONMENT_NAMES)}"

    def __str__(self) -> str:
        return self.message


def register_environment(name: str, path: str) -> None:
    """Add an environment class ("package.module:Class") under `name` — for environments
    that live outside this package (config `extra_environments`). Workers receive the
    same registrations, so the class must be importable there too."""
    module_name, sep, class_name = path.partition(":")
    if not sep or not module_name or not class_name.isidentifier():
        raise ValueError(f"environment path must look like 'package.module:Class', got {path!r}")
    existing = _REGISTRY.get(name)
    if existing is not None and existing != path:
        raise ValueError(f"environment {name!r} is already registered as {existing}")
    _REGISTRY[name] = path


def registered() -> dict[str, str]:
    """Every registered environment: name -> "module:Class"."""
    return dict(_REGISTRY)


@functools.cache
def get_environment(name: str) -> Environment:
    """The (stateless, shared) instance of environment `name`."""
    path = _REGISTRY.get(name)
    if path is None:
        raise UnknownEnvironment(name)
    module_name, _, class_name = path.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    env: Environment = cls()
    return env
