"""The recipe's `cluster` section: the nodes and GPUs a stage runs on at scale."""

from __future__ import annotations

from pydantic import Field, model_validator
from rlfleet_core.config import ConfigModel


class ClusterConfig(ConfigModel):
    """Where a stage runs at scale (used by the SLURM launcher and --dry-run plans)."""

    num_nodes: int = Field(1, ge=1)
    """All nodes of the stage, generation and judges included."""
    gpus_per_node: int = Field(8, ge=1)
    """GPUs on each node."""
    generation_nodes: int = Field(0, ge=0)
    """Nodes of the rollout service (generation not colocated with training); 0 = colocated."""
    gym_gpu_nodes: int = Field(0, ge=0)
    """GPU nodes for reward-side models (LLM judges, GenRM)."""

    @property
    def training_nodes(self) -> int:
        return self.num_nodes - self.generation_nodes - self.gym_gpu_nodes

    @model_validator(mode="after")
    def _training_nodes_left(self) -> ClusterConfig:
        if self.training_nodes < 1:
            raise ValueError(
                f"cluster.num_nodes ({self.num_nodes}) must exceed cluster.generation_nodes "
                f"({self.generation_nodes}) + cluster.gym_gpu_nodes ({self.gym_gpu_nodes}) "
                "to leave nodes for training"
            )
        return self
