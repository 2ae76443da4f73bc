"""The async replay buffer: scored prompt groups waiting to be trained on.

A group's `weight_version` is the oldest weight version any of its samples was generated
under. At training step with current version V, a group's policy lag is V − version;
groups with lag > max_trajectory_age_steps are evicted as stale (and counted), the rest
are served oldest first. This is NeMo-RL's rule: keep trajectories with version ≥
current − max_age.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rlfleet_trainer.batch import Trajectory


@dataclass
class PromptGroup:
    """All G scored samples of one prompt."""

    prompt_id: str
    env: str
    samples: list[Trajectory] = field(default_factory=list)

    @property
    def weight_version(self) -> int:
        return min(s.weight_version for s in self.samples)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "env": self.env,
            "samples": [asdict(s) for s in self.samples],
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> PromptGroup:
        return PromptGroup(
            prompt_id=data["prompt_id"],
            env=data["env"],
            samples=[Trajectory(**s) for s in data["samples"]],
        )


class ReplayBuffer:
    def __init__(self, max_age_steps: int) -> None:
        self.max_age_steps = max_age_steps
        self.groups: list[PromptGroup] = []

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: PromptGroup) -> None:
        self.groups.append(group)

    def evict_stale(self, current_version: int) -> list[PromptGroup]:
        """Remove and return groups with current_version − version > max_age_steps."""
        stale = [g for g in self.groups if current_version - g.weight_version > self.max_age_steps]
        self.groups = [g for g in self.groups if g not in stale]
        return stale

    def take(self, count: int) -> list[PromptGroup]:
        """The `count` oldest groups (by weight version, then arrival), removed, in the order
        of (weight version, prompt id): the same groups make the same batch whatever order
        they arrived in, so the step's sums (micro-batches, accumulation) round the same way
        run after run (Adam turns a rounding-level gradient into a full-size step)."""
        order = sorted(range(len(self.groups)), key=lambda i: (self.groups[i].weight_version, i))
        chosen = set(order[:count])
        taken = sorted(
            (self.groups[i] for i in order[:count]), key=lambda g: (g.weight_version, g.prompt_id)
        )
        self.groups = [g for i, g in enumerate(self.groups) if i not in chosen]
        return taken

    def rebase_versions(self, delta: int) -> None:
        """Shift every version by `delta` (resume: the restored weights got a new, larger
        version number; lag relative to them is unchanged)."""
        for group in self.groups:
            for sample in group.samples:
                sample.weight_version += delta

    def to_json(self) -> list[dict[str, Any]]:
        return [g.to_json() for g in self.groups]

    def load_json(self, data: list[dict[str, Any]]) -> None:
        self.groups = [PromptGroup.from_json(item) for item in data]
