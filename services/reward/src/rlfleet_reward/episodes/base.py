"""What a multi-turn environment is: its tools, its per-episode state, its verifier.

The manager (manager.py) does everything that is the same for every environment: it
parses a call's arguments, checks them against the tool's JSON Schema, bounds the call's
time and output, and turns every failure into an error result the policy reads. An
environment only implements the tools' effect on its state (`call`, raising `ToolError`
for a failure the policy should see), and the end-state check (`score`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from rlfleet_reward.types import Sample, Score


@dataclass(frozen=True)
class Tool:
    """A tool in OpenAI function-tool shape; `parameters` is the arguments' JSON Schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]


class ToolError(Exception):
    """A tool call failed in a way the policy should read (insufficient funds, no such
    account, ...): it becomes the call's result with error=true."""


@dataclass(frozen=True)
class CallOutcome:
    content: str
    done: bool = False
    """The environment ended the episode (a submit tool); later calls get errors."""


class EpisodeContext(Protocol):
    """What the manager lends an environment."""

    tool_timeout_s: float
    max_output_chars: int
    max_state_bytes: int
    close_timeout_s: float
    idle_timeout_s: float

    def sandbox(self) -> Any:
        """The gateway's sandbox client (SandboxClient), or None when not configured."""

    def swe_runner(self) -> Any:
        """The gateway's swe-runner client (SweRunnerClient), or None when not configured."""

    @property
    def swe(self) -> Any:
        """The gateway's `swe.*` settings (SweRunnerConfig)."""

    async def verify(self, env: str, spec: Any, sample: Sample, budget_s: float) -> Score:
        """Score with single-turn environment `env` where it is placed (killable)."""


class EpisodeEnvironment:
    name: ClassVar[str]
    description: ClassVar[str]
    required_fields: ClassVar[tuple[str, ...]] = ()
    optional_fields: ClassVar[tuple[str, ...]] = ()
    tools: ClassVar[tuple[Tool, ...]] = ()

    def parse_row(self, row: Mapping[str, Any]) -> Any:
        """The row's spec (picklable, small); RowError names a bad field."""
        raise NotImplementedError

    async def open(self, spec: Any, ctx: EpisodeContext) -> Any:
        """A fresh state for one episode (may start a sandbox session)."""
        raise NotImplementedError

    async def call(
        self, state: Any, tool: str, arguments: dict[str, Any], ctx: EpisodeContext
    ) -> CallOutcome:
        """Run one call whose arguments already match the tool's schema."""
        raise NotImplementedError

    async def score(self, spec: Any, state: Any, sample: Sample, ctx: EpisodeContext) -> Score:
        """Verify the end state (and the final answer, if the task has one)."""
        raise NotImplementedError

    async def release(self, state: Any, ctx: EpisodeContext) -> None:
        """Free what `open` took (sandbox sessions); called once, scored or not."""
