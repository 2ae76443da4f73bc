"""Environments that score a prompt's group of responses together (ScoreGroup only).

A `GroupEnvironment` runs in the gateway's event loop: `run_group` gets every response
of the group at once and returns one Score per response, in order (a comparison-based
reward such as `genrm_compare` has no per-response meaning).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rlfleet_reward.environments.base import Environment, RunContext
from rlfleet_reward.types import FailureKind, Sample, Score, failure

if TYPE_CHECKING:
    from rlfleet_reward.judge.client import JudgeClient
    from rlfleet_reward.judge.config import GenRMConfig


class GroupContext(Protocol):
    """What the gateway lends a group environment for one ScoreGroup call."""

    timeout_s: float
    """Time left for the whole group (already capped by the call's deadline)."""

    def judge(self) -> JudgeClient | None:
        """The gateway's judge client, or None when `judge.base_url` is not set."""

    def genrm(self) -> GenRMConfig:
        """The gateway's `genrm.*` settings."""


class GroupEnvironment(Environment):
    group_aware: ClassVar[bool] = True
    min_group_size: ClassVar[int] = 2

    async def run_group(
        self, spec: Any, samples: Sequence[Sample], ctx: GroupContext
    ) -> list[Score]:
        raise NotImplementedError

    async def run(self, spec: Any, sample: Sample, ctx: RunContext) -> Score:
        # The gateway refuses Score calls for group environments; this is the backstop.
        return failure(FailureKind.INVALID_ROW, f"{self.name} scores groups only: use ScoreGroup")
