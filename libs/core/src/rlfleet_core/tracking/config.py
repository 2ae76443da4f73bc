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
    name: str = ""
    """The W&B run name; "" = the stage (or pipeline) name."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """offline (the default) needs no network or account; `wandb sync <run dir>/wandb`
    uploads later. NeMo-RL has no such key (it is always online)."""


class MlflowConfig(ConfigModel):
    experiment_name: str = "rlfleet"
    run_name: str = ""
    """"" = the stage (or pipeline) name."""
    tracking_uri: str = ""
    """"" = a local file store, file:<run dir>/mlruns (no server)."""


class LoggerConfig(ConfigModel):
    """Experiment trackers besides metrics.jsonl (always written). Each tracker's package
    comes with `pip install rlfleet-core[tracking]`; docs/trainer.md "Metrics"."""

    tensorboard_enabled: bool = False
    wandb_enabled: bool = False
    mlflow_enabled: bool = False
    tensorboard: TensorBoardConfig = Field(default_factory=TensorBoardConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
