"""The recipe's `logger` section: which trackers a run writes to, named as NeMo-RL names
them (`logger.tensorboard_enabled`, `logger.wandb.project`, ...) so its configs carry over."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet_core.config import ConfigModel


class TensorBoardConfig(ConfigModel):
    log_dir: str = ""
    """Where the event files go; "" = <run dir>/tensorboard. A relative path is under the
    run dir."""


class WandbConfig(ConfigModel):
    project: str = "rlfleet"
    """The W&B project."""
    name: str = ""
    """The W&B run name; "" = the stage (or pipeline) name."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """offline (the default) needs no network or account; `wandb sync <run dir>/wandb`
    uploads later. NeMo-RL has no such key (it is always online)."""


class MlflowConfig(ConfigModel):
    experiment_name: str = "rlfleet"
    """The MLflow experiment (created when missing)."""
    run_name: str = ""
    """"" = the stage (or pipeline) name."""
    tracking_uri: str = ""
    """"" = a local file store, file:<run dir>/mlruns (no server)."""


class LoggerConfig(ConfigModel):
    """Experiment trackers besides metrics.jsonl (always written). Each tracker's package
    comes with `pip install rlfleet-core[tracking]`; docs/trainer.md "Metrics"."""

    tensorboard_enabled: bool = False
    """Write TensorBoard event files (logger.tensorboard.log_dir)."""
    wandb_enabled: bool = False
    """Log to a W&B run (offline by default: logger.wandb.mode)."""
    mlflow_enabled: bool = False
    """Log to an MLflow run (a local file store by default: logger.mlflow.tracking_uri)."""
    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    """Where TensorBoard writes."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """The W&B project, run name and mode."""
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    """The MLflow experiment, run name and tracking URI."""
