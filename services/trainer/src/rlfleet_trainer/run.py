"""One stage from its recipe: `context.build_context` (model, backend, data, clients →
`RunContext`), then `run_grpo` (or `dpo_stage.run_dpo` for a recipe of kind `dpo`), the HF
export and summary.json. `run_stage` is what `rlfleet-trainer run` calls; ranks other than
0 follow the driver (`run_follower`)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from rlfleet_contracts.recipe import RecipeConfig

from rlfleet_trainer.checkpoint import TrainerState, latest_checkpoint
from rlfleet_trainer.context import build_backend, build_context, seed_everything
from rlfleet_trainer.loop import run_grpo
from rlfleet_trainer.ranks import bind_threads_to_device, follow

logger = logging.getLogger(__name__)


def run_follower(recipe: RecipeConfig) -> TrainerState:
    """A rank other than 0: the same backend, no service connection, the driver's commands
    until it stops (see `ranks`)."""
    from rlfleet_core.models import resolve_model

    seed_everything(recipe.grpo.seed)
    backend = build_backend(recipe, resolve_model(recipe.policy.model))
    done = follow(backend, dist.get_rank())
    logger.info("follower done after %d commands", done)
    return TrainerState()


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
    dpo = recipe.kind == "dpo"
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
        ctx.backend.stop()  # only on success: after an error torchrun ends the others
        return state
    finally:
        await ctx.rollout.close()
        await ctx.reward.close()
