"""One sink per tracker. Each imports its package only when built, so a run that enables
none needs none of them."""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from rlfleet_core.tracking.config import LoggerConfig

INSTALL_HINT = "pip install rlfleet-core[tracking]"


class TrackingError(RuntimeError):
    """A tracker the recipe enables cannot start (its package is missing, ...)."""


class Sink(Protocol):
    name: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _require(module: str, key: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrackingError(
            f"{key}=true needs the {module.split('.')[0]} package: {INSTALL_HINT}"
        ) from exc


class JsonlSink:
    """metrics.jsonl: one object per step with rlfleet's own names (report.py reads it)."""

    name = "jsonl"

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        module = _require("torch.utils.tensorboard", "logger.tensorboard_enabled")
        self._writer = module.SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    name = "wandb"

    def __init__(self, run_dir: Path, project: str, name: str, mode: str) -> None:
        wandb = _require("wandb", "logger.wandb_enabled")
        # WANDB_DIR in the run folder: the offline run lands in <run dir>/wandb/.
        os.environ.setdefault("WANDB_DIR", str(run_dir))
        self._run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            mode=mode,
            # init_timeout: online mode reaches the W&B server; bounded like every call.
            settings=wandb.Settings(
                console="off", silent=True, x_disable_stats=True, init_timeout=60.0
            ),
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowSink:
    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str, run_name: str) -> None:
        mlflow = _require("mlflow", "logger.mlflow_enabled")
        if tracking_uri.startswith("file:"):
            # MLflow 3 keeps its file store behind an opt-in; a local folder (no server,
            # no database) is what a run folder wants.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._entities = importlib.import_module("mlflow.entities")
        self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        found = self._client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self._client.create_experiment(experiment)
        self._run_id = self._client.create_run(experiment_id, run_name=run_name).info.run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._entities.Metric(k, v, now, step) for k, v in metrics.items()]
        self._client.log_batch(self._run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


def build_sinks(run_dir: Path, config: LoggerConfig, run_name: str) -> list[Sink]:
    """The trackers `config` enables, in a stable order (TensorBoard, W&B, MLflow). One
    that cannot start raises TrackingError naming its key: a run asked to be tracked does
    not start untracked."""
    sinks: list[Sink] = []
    try:
        if config.tensorboard_enabled:
            log_dir = Path(config.tensorboard.log_dir or "tensorboard")
            log_dir = log_dir if log_dir.is_absolute() else run_dir / log_dir
            sinks.append(_start("tensorboard", lambda: TensorBoardSink(log_dir)))
        if config.wandb_enabled:
            w = config.wandb
            name = w.name or run_name
            sinks.append(_start("wandb", lambda: WandbSink(run_dir, w.project, name, w.mode)))
        if config.mlflow_enabled:
            m = config.mlflow
            uri = m.tracking_uri or (run_dir / "mlruns").resolve().as_uri()
            run = m.run_name or run_name
            sinks.append(_start("mlflow", lambda: MlflowSink(uri, m.experiment_name, run)))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def _start(name: str, build: Callable[[], Sink]) -> Sink:
    try:
        return build()
    except TrackingError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrackingError(f"logger.{name}_enabled: {name} could not start: {first}") from exc
