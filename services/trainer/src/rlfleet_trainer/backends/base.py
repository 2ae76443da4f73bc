"""The one interface every policy backend implements (torch, megatron)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from rlfleet_contracts.recipe import RecipeConfig

from rlfleet_trainer.algorithms.dpo import TrainLoss
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
            # A DPO stage's `copy` reference is the frozen copy KL uses.
            "keep_reference": recipe.grpo.kl_coef > 0
            or (recipe.kind == "dpo" and recipe.dpo.reference == "copy"),
        }


class PolicyBackend(Protocol):
    """A trainable policy: scores logprobs, takes optimizer steps, publishes and saves
    weights in Hugging Face names (so the rollout service and the next stage need no
    knowledge of the backend's internal layout).

    Ranks (the contract every backend keeps; the GRPO loop relies on it):

    - One process per rank, launched by torchrun (or srun exporting the same RANK,
      WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); the trainer entry initialises the
      default process group *before* building the backend. Without a process group (a plain
      process) everything below holds with one rank.
    - `data_parallel_rank` / `data_parallel_size`: this rank's place among the replicas that
      see different data. Ranks that hold one replica's model parallel pieces (TP/PP) share
      a data-parallel rank. torch/FSDP2: data_parallel_size = world size.
    - Global rank 0 is the driver: it alone talks to rollout and reward, prepares each step's
      full batch and broadcasts it; every rank then calls `logprobs` / `train_step` with the
      slice `rlfleet_trainer.ranks.rank_slice(batch, data_parallel_rank, data_parallel_size)`
      (contiguous, every slice padded to the same size with zero-mask rows so all ranks run
      the same number of micro-batches). Both are collective: every rank calls them, the same
      number of times, in the same order.
    - The loss normaliser (valid tokens / sequences) is the *global* batch's, reduced over the
      data-parallel group, so the gradient summed over ranks equals one process's on the
      whole batch. `train_step`'s metrics are the global step's, valid on global rank 0 (the
      backend sums the additive ones over its data-parallel group).
    - `hf_state_dict()` is collective: every rank calls it and consumes the iterator; the
      weights are gathered once and only global rank 0 (the publishing rank) gets tensors,
      every other rank gets an empty iterator.
    - `save(path)` / `load(path)` are collective: `path` is the same folder on every rank (a
      shared filesystem), created by rank 0 before the call. Each rank writes its own shard
      files (names carry the rank, or torch.distributed.checkpoint's); one rank writes the
      shared ones. The caller barriers after `save` and only then commits the folder (atomic
      rename by rank 0), so a committed checkpoint always has every rank's shards.
    - `export_hf(path)` is collective; only global rank 0 writes the folder.
    """

    data_parallel_rank: int
    data_parallel_size: int

    def logprobs(self, batch: TrainBatch, *, reference: bool = False) -> torch.Tensor:
        """log π(token_{t+1} | tokens_{≤t}) for every position of this rank's slice, [N, T],
        no grad. With `reference=True`, under the frozen initial policy (needs kl_coef > 0
        at setup). Collective."""
        ...

    def train_step(self, batch: TrainBatch, loss_config: TrainLoss) -> dict[str, float]:
        """One optimizer step over this rank's slice (gradient accumulation over micro
        batches, loss normalised by the global token/sequence count); returns the global
        step's metrics (valid on global rank 0). Collective. With the `dpo` section the
        rows are (chosen, rejected) pairs interleaved (rlfleet_trainer.dpo builds them),
        both through the same forward and logprob path as GRPO's samples."""
        ...

    def hf_state_dict(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights in HF names, on CPU, in a stable order, on global rank 0;
        an empty iterator on every other rank. Collective: every rank consumes it."""
        ...

    def save(self, path: Path) -> None:
        """Model, optimizer and scheduler state into the folder `path` (exists, empty; the
        same folder on every rank). Collective: per-rank shard files + shared files."""
        ...

    def load(self, path: Path) -> None:
        """Restore what `save` wrote (same world size). Collective."""
        ...

    def export_hf(self, path: Path) -> None:
        """A HF model folder (config, safetensors, tokenizer) loadable by from_pretrained.
        Collective; global rank 0 writes."""
        ...
