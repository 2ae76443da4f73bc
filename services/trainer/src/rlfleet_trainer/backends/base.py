"""The one interface every policy backend implements (torch, megatron)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from rlfleet_trainer.algorithms.losses import LossConfig
from rlfleet_trainer.batch import TrainBatch


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
