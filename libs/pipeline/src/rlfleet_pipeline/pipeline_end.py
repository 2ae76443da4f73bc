"""What a pipeline measures beyond each stage's own validation, with the trainer's `eval`
command (rlfleet_trainer.evaluate) against the run's fleet:

- after a judged stage (rlhf), its GenRM win rate against its start: the stage's held-out
  answers after training judged pair by pair against its answers before, while the judge
  still serves (<stage>/genrm_win_rate.json);
- at the end, the regressions: the final export on the held-out sets of the earlier
  stages of `Pipeline.regression_kinds`, each as that stage validates
  (<out>/regression/<stage>/heldout.json, results.json).

Each is skipped when its result file exists (a resumed run does not measure twice).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rlfleet_contracts.recipe import kind_of_stage
from rlfleet_contracts.run_folder import PipelineFolder, StageFolder

from rlfleet_pipeline.fleet import tail_lines
from rlfleet_pipeline.pipelines import Pipeline, PipelineStage

JUDGED_KINDS = ("rlhf",)
REGRESSION_RESULTS = "results.json"
REGRESSION_SERVICES = ("sandbox", "reward", "rollout")
"""What the regression eval needs running: the rlvr and swe1 recipes' scorers."""


class MeasureError(RuntimeError):
    """An end-of-stage or end-of-run measurement failed; the message has its log tail."""


def stage_kind(name: str) -> str:
    """rlvr2 -> rlvr, swe1 -> swe, rlhf -> rlhf: a pipeline stage's kind from its name (as
    a recipe reads it: rlfleet_contracts.recipe.kind_of_stage)."""
    return kind_of_stage(name) or name


@dataclass
class EndMeasures:
    out: Path
    pipeline: Pipeline

    def win_rate_due(self, stage: PipelineStage) -> bool:
        folder = self._stage(stage)
        return stage_kind(stage.name) in JUDGED_KINDS and not folder.win_rate.exists()

    def regression_stages(self) -> list[PipelineStage]:
        """Earlier stages measured again at the end (not the last: it just validated)."""
        kinds = self.pipeline.regression_kinds
        return [
            s for s in self.pipeline.stages[:-1] if s.name in kinds or stage_kind(s.name) in kinds
        ]

    @property
    def regression_dir(self) -> Path:
        return PipelineFolder(self.out).regression

    def regression_due(self) -> bool:
        return (
            bool(self.regression_stages())
            and not (self.regression_dir / REGRESSION_RESULTS).exists()
        )

    def run_win_rate(self, stage: PipelineStage, targets: dict[str, str]) -> dict[str, float]:
        folder = self._stage(stage)
        self._trainer_eval(
            ["--win-rate", str(folder.root), "-c", str(folder.recipe_yaml), *_wired(targets)],
            folder.root / "win_rate.log",
        )
        return dict(json.loads(folder.win_rate.read_text()))

    def run_regression(self, targets: dict[str, str]) -> dict[str, dict[str, float]]:
        final = self._stage(self.pipeline.stages[-1]).hf
        recipes = [
            arg for s in self.regression_stages() for arg in ("-c", str(self._stage(s).recipe_yaml))
        ]
        self.regression_dir.mkdir(parents=True, exist_ok=True)
        self._trainer_eval(
            ["--model", str(final), "--out", str(self.regression_dir), *recipes, *_wired(targets)],
            self.regression_dir / "eval.log",
        )
        return dict(json.loads((self.regression_dir / REGRESSION_RESULTS).read_text()))

    def _stage(self, stage: PipelineStage) -> StageFolder:
        return PipelineFolder(self.out).stage(stage.name)

    @staticmethod
    def _trainer_eval(args: list[str], log_path: Path) -> None:
        command = [sys.executable, "-m", "rlfleet_trainer", "eval", *args]
        with log_path.open("ab") as log:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            raise MeasureError(
                f"`rlfleet-trainer eval` exited with code {done.returncode}; last lines of "
                f"{log_path}:\n{tail_lines(log_path, 20)}"
            )


def _wired(targets: dict[str, str]) -> list[str]:
    return [f"services.{name}={target}" for name, target in sorted(targets.items())]
