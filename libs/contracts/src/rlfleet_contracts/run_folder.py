"""The layout of run folders: the one place that names their files.

A *stage folder* is what one `rlfleet rl` stage (one trainer run) writes and what the
pipeline, the report and a resumed run read back. A *pipeline folder* holds the blends,
one stage folder per stage, and the pipeline's own report. Writers and readers both go
through these classes, so a renamed file cannot leave one side behind.

    <pipeline>/                   PipelineFolder
      run.json                    what was asked (recipe names, overrides) — resume checks it
      walls.json                  wall time per finished stage
      data/<blend>/               prepared blends (train/, val/, manifest.json)
      stages/<stage>/             StageFolder, one per stage
      plots/                      report plots
      report.md, report.json      the report
      logs/                       service logs of the fleet (and <service>.ports.json)
      auth_token                  the fleet's shared auth token (mode 0600; docs/security.md)
      startup.json                the fleet's start-up times per service

    <stage>/                      StageFolder
      recipe.yaml                 the recipe the trainer was started with
      recipe.json                 the validated recipe, every default filled in
      trainer.log                 trainer stdout/stderr when a launcher captured it
      metrics.jsonl               one JSON object per step
      heldout.json                held-out reward {"before": {...}, "after": {...}, "samples"...}
      heldout_<label>.jsonl       every held-out sample (text, reward) of one validation
      ledger.jsonl                prompt ledger (exactly-once accounting)
      pairs.jsonl                 a DPO stage's preference pairs (text, verdicts, rewards)
      summary.json                written last: the stage finished
      lineage.json                input checkpoint, data, recipe (rlfleet run / rlfleet rl)
      checkpoints/step_N/         resumable trainer checkpoints
      hf/                         the exported Hugging Face model (the next stage's input)
      logs/                       service logs of launchers
      auth_token                  the fleet's auth token, when `rlfleet rl` started the fleet
      startup.json                the fleet's start-up times, when `rlfleet rl` started it
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The blend manifest data prep writes next to train/ and val/.
BLEND_MANIFEST = "manifest.json"
# A Hugging Face model folder is complete once this file exists.
HF_CONFIG = "config.json"


@dataclass(frozen=True)
class FleetFolder:
    """What a launcher writes for the fleet it started, in a stage's or a pipeline's folder."""

    root: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def auth_token(self) -> Path:
        """The shared token of the fleet a launcher started for this run (0600)."""
        return self.root / "auth_token"

    @property
    def startup(self) -> Path:
        """The start-up report of the fleet a launcher started for this run."""
        return self.root / "startup.json"


@dataclass(frozen=True)
class StageFolder(FleetFolder):
    """Paths inside one stage's run folder."""

    @property
    def recipe_yaml(self) -> Path:
        return self.root / "recipe.yaml"

    @property
    def recipe_json(self) -> Path:
        return self.root / "recipe.json"

    @property
    def trainer_log(self) -> Path:
        return self.root / "trainer.log"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def heldout(self) -> Path:
        return self.root / "heldout.json"

    def heldout_samples(self, label: str) -> Path:
        """Every sample of the validation called `label` ("before", "after")."""
        return self.root / f"heldout_{label}.jsonl"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def pairs(self) -> Path:
        """A DPO stage's preference pairs (rlfleet_contracts.preference rows)."""
        return self.root / "pairs.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def lineage(self) -> Path:
        return self.root / "lineage.json"

    @property
    def hf(self) -> Path:
        return self.root / "hf"

    @property
    def win_rate(self) -> Path:
        """A judged stage's held-out answers after vs before, by its GenRM (`rlfleet-trainer
        eval --win-rate`)."""
        return self.root / "genrm_win_rate.json"

    def checkpoints(self, subdir: str = "checkpoints") -> Path:
        """The checkpoint folder (`checkpoint.dir` of the recipe, relative to the stage)."""
        return self.root / subdir

    def finished(self) -> bool:
        """The trainer wrote its summary and a complete HF export: the stage is done."""
        return self.summary.exists() and (self.hf / HF_CONFIG).exists()


@dataclass(frozen=True)
class PipelineFolder(FleetFolder):
    """Paths inside a whole pipeline's run folder."""

    @property
    def run_spec(self) -> Path:
        return self.root / "run.json"

    @property
    def walls(self) -> Path:
        return self.root / "walls.json"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def blend(self, name: str) -> Path:
        return self.data / name

    def stage(self, name: str) -> StageFolder:
        return StageFolder(self.root / "stages" / name)

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_json(self) -> Path:
        return self.root / "report.json"

    @property
    def regression(self) -> Path:
        """The final weights on earlier stages' held-out sets: <stage>/heldout.json and
        results.json (`rlfleet-trainer eval`)."""
        return self.root / "regression"
