"""The one interface every policy backend implements (torch, megatron)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from rlfleet_contracts.recipe import RecipeConfig

from rlfleet_trainer.algorithms.losses import LossConfig
from rlfleet_trainer.batch import TrainBatch

_RECIPE = RecipeConfig()


def logprob_temperature(recipe: RecipeConfig) -> float:
    """τ the trainer divides logits by, matching the rollout's `generation.logprobs_mode`."""
    if recipe.generation.logprobs_mode == "processed" and recipe.generation.temperature > 0:
        return recipe.generation.temperature
    return 1.0


@dataclass
class BackendConfig:
    """What every backend takes from the recipe; the defaults are the recipe schema's."""

    model_path: Path
    lr: float = _RECIPE.grpo.lr
    weight_decay: float = _RECIPE.policy.optimizer.weight_decay
    betas: tuple[float, float] = _RECIPE.policy.optimizer.betas
    eps: float = _RECIPE.policy.optimizer.eps
    max_grad_norm: float | None = _RECIPE.policy.optimizer.max_grad_norm
    warmup_steps: int = _RECIPE.policy.optimizer.warmup_steps
    train_micro_batch_size: int = _RECIPE.policy.train_micro_batch_size
    logprob_micro_batch_size: int = _RECIPE.policy.logprob_micro_batch_size
    temperature: float = 1.0
    """Logits are divided by this before log-softmax, so logprobs are those of the
    distribution the rollout sampled from (NeMo-RL does the same)."""
    keep_reference: bool = False
    """Keep a frozen copy of the initial weights for KL (kl_coef > 0)."""

    @staticmethod
    def recipe_values(recipe: RecipeConfig, model_path: Path) -> dict[str, Any]:
        """The fields above, from a recipe (a backend's `from_recipe` adds its own)."""
        p, o = recipe.policy, recipe.policy.optimizer
        return {
            "model_path": model_path,
            "lr": recipe.grpo.lr,
            "weight_decay": o.weight_decay,
            "betas": o.betas,
            "eps": o.eps,
            "max_grad_norm": o.max_grad_norm,
            "warmup_steps": o.warmup_steps,
            "train_micro_batch_size": p.train_micro_batch_size,
            "logprob_micro_batch_size": p.logprob_micro_batch_size,
            "temperature": logprob_temperature(recipe),
            "keep_reference": recipe.grpo.kl_coef > 0,
        }


class PolicyBackend(Protocol):
    """A trainable policy: scores logprobs, takes optimizer steps, publishes and saves
    weights in Hugging Face names (so the rollout service and the next stage need no
    knowledge of the backend's internal layout)."""

    def logprobs(self, batch: TrainBatch, *, reference: bool = False) -> torch.Tensor:
        """log π(token_{t+1} | tokens_{≤t}) for every position, [N, T], no grad. With
        `reference=True`, under the frozen initial policy (needs kl_coef > 0 at setup)."""
        ...

    def train_step(self, batch: TrainBatch, loss_config: LossConfig) -> dict[str, float]:
        """One optimizer step over the whole batch (gradient accumulation over micro
        batches, loss normalised by the global token/sequence count); returns metrics."""
        ...

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights in HF names, on CPU, in a stable order."""
        ...

    def save(self, path: Path) -> None:
        """Model, optimizer and scheduler state into the folder `path` (exists, empty)."""
        ...

    def load(self, path: Path) -> None:
        """Restore what `save` wrote."""
        ...

    def export_hf(self, path: Path) -> None:
        """A HF model folder (config, safetensors, tokenizer) loadable by from_pretrained."""
        ...
