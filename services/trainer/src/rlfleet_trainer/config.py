"""Configuration of the trainer service (`rlfleet serve trainer key=value ...`)."""

from __future__ import annotations

from pydantic import Field
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.server import ServiceConfig


class TrainerServiceConfig(ServiceConfig):
    """Settings of the trainer service (`server.*` is shared by every service)."""

    recipe: RecipeConfig = RecipeConfig()
    """The stage to train (dotted overrides: recipe.grpo.lr=1e-6 ...)."""
    run_dir: str = "runs/trainer"
    """Run folder: ledger, metrics, checkpoints, exported HF weights."""
    autostart: bool = False
    """Start training as soon as the service is up; otherwise it idles (status only)."""
    resume: bool = False
    """Continue from the latest checkpoint in run_dir."""
    save_checkpoint_timeout_s: float = Field(3600.0, gt=0)
    """How long SaveCheckpoint waits for the next step boundary."""
