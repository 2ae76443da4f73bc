"""The schema of a stage recipe (YAML under recipes/), shared by the CLI and the trainer.

Defaults live here and only here; recipe files state overrides. Cross-field rules are
checked at load time with messages that name the fields and the fix.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlfleet_core.config import ConfigModel


class GRPOConfig(ConfigModel):
    """Group Relative Policy Optimization (Shao et al., 2024), as run by NeMo-RL."""

    num_prompts_per_step: int = Field(8, ge=1)
    """Prompt groups per optimizer step."""
    num_generations_per_prompt: int = Field(4, ge=2)
    """Samples per prompt (G); advantages are relative within a group, so G >= 2."""
    max_num_steps: int = Field(10, ge=1)
    """Optimizer steps in this stage."""
    lr: float = Field(1e-6, gt=0, lt=1)
    """Learning rate of the policy optimizer."""
    seed: int = 42
    """Seeds data order, sampling and initialisation."""
    normalize_rewards: bool = True
    """Divide advantages by the leave-one-out std of the group's rewards."""
    use_leave_one_out_baseline: bool = True
    """Baseline = mean of the other G-1 rewards (RLOO) instead of the group mean."""
    advantage_clip: float | None = Field(None, gt=0)
    """Clip advantages to [-c, c] (Super uses 50); None = off."""
    ratio_clip_min: float = Field(0.2, ge=0, lt=1)
    """Lower PPO clip epsilon: ratio >= 1 - ratio_clip_min."""
    ratio_clip_max: float = Field(0.28, ge=0)
    """Upper PPO clip epsilon (clip-higher, DAPO recommends 0.28)."""
    kl_coef: float = Field(0.0, ge=0)
    """KL penalty coefficient against the frozen reference policy (0 in RLVR and SWE)."""
    kl_type: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (Schulman's k1/k2/k3)."""
    overlong_filtering: bool = False
    """Truncated samples (no EOS within the length limit) get loss weight 0."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards are all equal (no learning signal); counted."""
    max_trajectory_age_steps: int = Field(1, ge=0)
    """Async GRPO: samples older than this many weight versions are dropped; 0 = synchronous."""
    in_flight_weight_updates: bool = True
    """Update rollout weights while requests are in flight (async only)."""


class GenerationConfig(ConfigModel):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)
    """Generated tokens per sample; hitting it means truncation (finish reason `length`)."""


class PolicyConfig(ConfigModel):
    model: str = "smollm2-135m-instruct"
    """A local HF folder or a bundled model name (smollm2-135m-instruct, tiny)."""
    backend: Literal["torch", "megatron"] = "torch"
    max_total_sequence_length: int = Field(1024, ge=16)
    """Prompt + generation tokens per sample."""
    train_micro_batch_size: int = Field(4, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    context_parallel_size: int = Field(1, ge=1)
    expert_parallel_size: int = Field(1, ge=1)


class RecipeConfig(ConfigModel):
    """One RL stage: what to train, on which data, with which algorithm settings."""

    stage: str = "rlvr"
    """Stage name, e.g. rlvr1, swe1, rlhf."""
    grpo: GRPOConfig = GRPOConfig()
    generation: GenerationConfig = GenerationConfig()
    policy: PolicyConfig = PolicyConfig()

    @model_validator(mode="after")
    def _generation_fits_context(self) -> RecipeConfig:
        if self.generation.max_new_tokens >= self.policy.max_total_sequence_length:
            raise ValueError(
                f"generation.max_new_tokens ({self.generation.max_new_tokens}) must be smaller "
                f"than policy.max_total_sequence_length ({self.policy.max_total_sequence_length}) "
                "to leave room for the prompt; lower one or raise the other"
            )
        return self
