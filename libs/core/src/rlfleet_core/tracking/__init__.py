"""One metrics interface for the trainer and the pipeline: `MetricsLogger` writes each
step to metrics.jsonl (rlfleet's names) and to the trackers the recipe's `logger` section
enables (TensorBoard, W&B, MLflow; NeMo-RL's names, see names.py). A tracker that fails
mid-run (disk full, a W&B error) logs one warning and is dropped; the run goes on."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from rlfleet_core.tracking.config import (
    LoggerConfig,
    MlflowConfig,
    TensorBoardConfig,
    WandbConfig,
)
from rlfleet_core.tracking.names import NEMO_RL_NAMES, OWN_NAMES, tracker_name
from rlfleet_core.tracking.sinks import (
    INSTALL_HINT,
    JsonlSink,
    Sink,
    TrackingError,
    build_sinks,
)

__all__ = [
    "INSTALL_HINT",
    "NEMO_RL_NAMES",
    "OWN_NAMES",
    "LoggerConfig",
    "MetricsLogger",
    "MlflowConfig",
    "TensorBoardConfig",
    "TrackingError",
    "WandbConfig",
    "tracker_name",
]

logger = logging.getLogger(__name__)


class MetricsLogger:
    """Log one step's metrics everywhere. `jsonl` = the metrics.jsonl to append to (None:
    trackers only, e.g. the pipeline's stage summaries)."""

    def __init__(
        self,
        run_dir: Path,
        config: LoggerConfig | None = None,
        *,
        run_name: str = "",
        jsonl: Path | None = None,
    ) -> None:
        self.jsonl: Sink | None = JsonlSink(jsonl) if jsonl is not None else None
        try:
            self.trackers = build_sinks(run_dir, config or LoggerConfig(), run_name or run_dir.name)
        except BaseException:
            self.close()
            raise

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if self.jsonl is not None:  # the record of the run: its errors are not swallowed
            self.jsonl.log(step, metrics)
        scalars = {
            tracker_name(k): float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        for sink in list(self.trackers):
            try:
                sink.log(step, scalars)
            except Exception as exc:
                self._drop(sink, exc)

    def close(self) -> None:
        for sink in list(getattr(self, "trackers", [])):
            try:
                sink.close()
            except Exception as exc:
                self._drop(sink, exc)
        if self.jsonl is not None:
            self.jsonl.close()

    def _drop(self, sink: Sink, exc: Exception) -> None:
        logger.warning("%s tracker failed (%s); disabled for the rest of the run", sink.name, exc)
        self.trackers.remove(sink)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
