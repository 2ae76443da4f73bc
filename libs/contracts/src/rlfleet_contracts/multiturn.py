"""The `multi_turn` recipe section: which environments run as multi-turn (agentic)
episodes, and the limits of one trajectory.

A row whose environment is listed in `envs` is not generated in one shot: the trainer opens
an episode on the reward gateway (OpenEpisode), lets the policy call the episode's tools
turn by turn (Step), and scores the end state (CloseEpisode). See docs/trainer.md,
"Multi-turn rollouts".
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from rlfleet_core.config import ConfigModel


class MultiTurnConfig(ConfigModel):
    """Multi-turn rollouts: the environments that use them and per-trajectory limits."""

    envs: list[str] = Field(default_factory=list)
    """Environments (a row's `env` / `agent_ref.name`) run through the multi-turn loop;
    every other row stays single-turn."""
    max_turns: int = Field(8, ge=1)
    """Model turns per trajectory; a policy still calling tools after the last one ends
    truncated (overlong filtering applies)."""
    max_trajectory_tokens: int | None = Field(None, ge=2)
    """Prompt + model + environment tokens of one trajectory; None = the policy's
    `max_total_sequence_length`. A trajectory that would pass it stops, truncated."""
    max_trajectory_time_s: float = Field(600.0, gt=0)
    """Wall time of one trajectory, its calls included; past it the trajectory stops,
    truncated, and its episode is scored as it stands."""
    step_timeout_s: float = Field(60.0, gt=0)
    """Deadline of each OpenEpisode, Step and CloseEpisode call."""
    tool_call_format: Literal["hermes", "nemotron"] = "hermes"
    """How the model writes tool calls: `hermes` = `<tool_call>{"name": ..., "arguments":
    {...}}</tool_call>` (Qwen2.5, Qwen3, Hermes templates); `nemotron` = `<TOOLCALL>[{...},
    ...]</TOOLCALL>`. rlfleet_trainer.agent.tool_format holds both."""
