"""Setup of a GRPO stage from a recipe: model, backend, data, clients → `RunContext`,
then `run_grpo` (or `dpo_stage.run_dpo` for a `dpo` stage). `run_stage` is what
`rlfleet-trainer run` and the service call."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from rlfleet_contracts.preference import is_dpo_stage
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import StageFolder

from rlfleet_trainer.backends.base import PolicyBackend
from rlfleet_trainer.checkpoint import TrainerState, latest_checkpoint
from rlfleet_trainer.clients import CallRetry, RewardClient, RolloutClient
from rlfleet_trainer.data import PromptSource, read_rows
from rlfleet_trainer.loop import RunContext, run_grpo
from rlfleet_trainer.ranks import DriverBackend, bind_threads_to_device, follow

logger = logging.getLogger(__name__)


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
    backend: PolicyBackend = build_backend(recipe, model_path)
    if dist.is_initialized() and dist.get_world_size() > 1:
        backend = DriverBackend(backend)
    return RunContext(
        recipe=recipe,
        backend=backend,
        source=PromptSource.from_recipe(
            recipe, rows, tokenizer, recipe.data.shuffle, training=True
        ),
        val_source=PromptSource.from_recipe(recipe, val_rows, tokenizer, False, weighted=False)
        if val_rows
        else None,
        rollout=RolloutClient(
            services.rollout, services.generate_timeout_s, services.weight_bucket_bytes, retry
        ),
        reward=RewardClient(services.reward, services.score_timeout_s, retry),
        tokenizer=tokenizer,
        run_dir=run_dir,
    )


def run_follower(recipe: RecipeConfig) -> TrainerState:
    """A rank other than 0: the same backend, no service connection, the driver's commands
    until it stops (see `ranks`)."""
    from rlfleet_core.models import resolve_model

    seed_everything(recipe.grpo.seed)
    backend = build_backend(recipe, resolve_model(recipe.policy.model))
    done = follow(backend, dist.get_rank())
    logger.info("follower done after %d commands", done)
    return TrainerState()


def _rows(path: str | None, key: str) -> list[dict[str, Any]]:
    if not path:
        raise ValueError(f"{key} is not set: give the training rows (JSONL) or pass rows")
    return read_rows(path)


async def run_stage(
    recipe: RecipeConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    rows: Sequence[dict[str, Any]] | None = None,
    val_rows: Sequence[dict[str, Any]] | None = None,
) -> TrainerState:
    """Train the stage, export the final weights as a HF folder, return the final state.
    Under torchrun every rank calls this: rank 0 drives the stage, the others follow."""
    bind_threads_to_device(asyncio.get_running_loop())
    dpo = is_dpo_stage(recipe.stage)
    if dpo:
        if dist.is_initialized() and dist.get_world_size() > 1:
            raise ValueError("a dpo stage trains in one process (no torchrun)")
        # The backends' optimizer reads grpo.lr; a DPO stage trains at dpo.lr.
        recipe = recipe.model_copy(
            update={"grpo": recipe.grpo.model_copy(update={"lr": recipe.dpo.lr})}
        )
    if dist.is_initialized() and dist.get_rank() != 0:
        return await asyncio.to_thread(run_follower, recipe)
    ctx = build_context(recipe, run_dir, rows, val_rows)
    try:
        if dpo:
            from rlfleet_trainer.dpo_stage import run_dpo

            state = await run_dpo(ctx, resume=resume)
        else:
            state = await run_grpo(ctx, resume=resume)
        if recipe.checkpoint.export_hf:
            ctx.backend.export_hf(ctx.folder.hf)
        ctx.folder.summary.write_text(
            json.dumps(
                {
                    "step": state.step,
                    "weight_version": state.weight_version,
                    "data_cursor": state.data_cursor,
                    "checkpoint": str(latest_checkpoint(ctx.checkpoint_dir)),
                    "metrics": state.last_metrics,
                },
                indent=2,
            )
        )
        if isinstance(ctx.backend, DriverBackend):
            ctx.backend.stop()  # only on success: after an error torchrun ends the others
        return state
    finally:
        await ctx.rollout.close()
        await ctx.reward.close()
