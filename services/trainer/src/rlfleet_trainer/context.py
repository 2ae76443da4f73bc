"""What a stage runs with, built once from its recipe: `build_context` makes the policy
backend (wrapped for the ranks, `ranks.TrainerBackend`), the prompt sources, the rollout
client with its weight sender and the reward client, and hands them over as a `RunContext`
to `loop.run_grpo`, `dpo_stage.run_dpo`, `validation.validate` and `evaluate`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rlfleet_contracts.recipe import RecipeConfig, ServicesConfig
from rlfleet_contracts.reward_client import RewardClient
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.calls import CallRetry
from rlfleet_weights.factory import make_sender

from rlfleet_trainer.backends.base import PolicyBackend
from rlfleet_trainer.clients import RolloutClient, RolloutStub
from rlfleet_trainer.data import PromptSource, read_rows
from rlfleet_trainer.ranks import DriverBackend, SingleRankBackend, TrainerBackend


@dataclass
class RunContext:
    recipe: RecipeConfig
    backend: TrainerBackend
    source: PromptSource
    rollout: RolloutClient
    reward: RewardClient
    tokenizer: Any
    run_dir: Path
    val_source: PromptSource | None = None
    on_step: Callable[[int, dict[str, float]], None] | None = None
    """Called after each step with its metrics (the service's status, tests)."""
    status: dict[str, Any] = field(default_factory=dict)
    """phase, step, weight_version, metrics: what TrainerService.GetStatus reports."""
    checkpoint_requests: list[asyncio.Future[tuple[Path, int]]] = field(default_factory=list)
    """SaveCheckpoint calls waiting for the next step boundary."""

    @property
    def folder(self) -> StageFolder:
        return StageFolder(self.run_dir)

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder.checkpoints(self.recipe.checkpoint.dir)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_backend(recipe: RecipeConfig, model_path: Path) -> PolicyBackend:
    """The policy backend named by `policy.backend`."""
    backend = recipe.policy.backend
    if backend == "torch":
        from rlfleet_trainer.backends.torch_backend import TorchPolicy

        return TorchPolicy.from_recipe(recipe, model_path)
    if backend == "megatron":
        from rlfleet_trainer.backends.megatron_backend import MegatronPolicy

        return MegatronPolicy.from_recipe(recipe, model_path)
    raise ValueError(f"unknown policy.backend {backend!r}; valid: torch, megatron")


def rollout_client(services: ServicesConfig, retry: CallRetry) -> RolloutClient:
    """The rollout client and its weight sender (`services.weight_transport`), made once
    here; the sender holds the client's stub, so both share one channel."""
    stub = RolloutStub(services.rollout)
    sender = make_sender(
        services.weight_transport,
        stub,
        bucket_bytes=services.weight_bucket_bytes,
        shared_dir=services.shared_dir,
    )
    return RolloutClient(stub, services.generate_timeout_s, retry, sender=sender)


def build_context(
    recipe: RecipeConfig,
    run_dir: Path,
    rows: Sequence[dict[str, Any]] | None = None,
    val_rows: Sequence[dict[str, Any]] | None = None,
) -> RunContext:
    from rlfleet_core.models import resolve_model
    from transformers import AutoTokenizer

    seed_everything(recipe.grpo.seed)
    model_path = resolve_model(recipe.policy.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = rows if rows is not None else _rows(recipe.data.train_path, "data.train_path")
    if val_rows is None and recipe.data.val_path:
        val_rows = read_rows(recipe.data.val_path)
    services = recipe.services
    retry = CallRetry(services.call_attempts, services.retry_backoff_s)
    run_dir.mkdir(parents=True, exist_ok=True)
    StageFolder(run_dir).recipe_json.write_text(recipe.model_dump_json(indent=2))
    policy = build_backend(recipe, model_path)
    several_ranks = dist.is_initialized() and dist.get_world_size() > 1
    backend = DriverBackend(policy) if several_ranks else SingleRankBackend(policy)
    return RunContext(
        recipe=recipe,
        backend=backend,
        source=PromptSource.from_recipe(
            recipe, rows, tokenizer, recipe.data.shuffle, training=True
        ),
        val_source=PromptSource.from_recipe(recipe, val_rows, tokenizer, False, weighted=False)
        if val_rows
        else None,
        rollout=rollout_client(services, retry),
        reward=RewardClient(services.reward, services.score_timeout_s, retry),
        tokenizer=tokenizer,
        run_dir=run_dir,
    )


def _rows(path: str | None, key: str) -> list[dict[str, Any]]:
    if not path:
        raise ValueError(f"{key} is not set: give the training rows (JSONL) or pass rows")
    return read_rows(path)
