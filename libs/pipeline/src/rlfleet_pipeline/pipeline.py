"""`rlfleet run`: a multi-stage pipeline on this machine, the embedded default.

One run folder holds everything:

    <out>/run.json                 what was asked (pipeline, engine, overrides), for --resume
    <out>/data/<blend>/...         prepared train/val splits + manifest per stage blend
    <out>/logs/<service>.log       the services (one fleet for the whole run)
    <out>/stages/<stage>/          the trainer's run dir: recipe, metrics.jsonl, ledger,
                                   checkpoints/, hf/ (export), heldout.json, lineage.json
    <out>/report.md|json, plots/   the end-of-run report

The services start once (vLLM's start is the slow part) and serve every stage: each stage
starts from the previous stage's exported HF folder and publishes it to the rollout
service before its first sample. Each stage's trainer is a child process (`rlfleet-trainer
run`); its metrics file drives the progress bar. Ctrl-C stops the trainer and the
services; `--resume` skips finished stages and resumes the interrupted one from its last
checkpoint (the trainer's ledger keeps every prompt accounted for).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.rows import DataError
from rlfleet_contracts.run_folder import BLEND_MANIFEST, PipelineFolder, StageFolder
from rlfleet_core.config import dump_yaml, format_override
from rlfleet_dataprep.prep import PrepOptions, prepare_rl, resolve_blend

from rlfleet_pipeline.fleet import LocalFleet, tail_lines
from rlfleet_pipeline.recipes import load_recipe
from rlfleet_pipeline.report import StageResult, read_metrics, write_report
from rlfleet_pipeline.run_report import log_stage_summaries, stage_result_from_folder
from rlfleet_pipeline.stage import trainer_command, trainer_end


class PipelineError(RuntimeError):
    """A pipeline problem a user can act on; the message says what and how."""


@dataclass(frozen=True)
class PipelineStage:
    name: str
    recipe: str
    """A bundled recipe name or a recipe file."""
    blend: str
    """A bundled blend name or a blend file/directory (prepared into <out>/data)."""


@dataclass(frozen=True)
class Pipeline:
    name: str
    model: str
    """Starting model of the first stage (a bundled name, a HF folder or a Hugging Face id)."""
    stages: tuple[PipelineStage, ...]
    services: tuple[str, ...] = ("sandbox", "reward", "rollout")
    val_rows: int = 100
    """Rows of each blend held out for validation (the last ones)."""


TINY = Pipeline(
    name="tiny",
    model="smollm2-135m-instruct",
    stages=tuple(PipelineStage(f"rlvr{i}", f"tiny/rlvr{i}", f"tiny-rlvr{i}") for i in (1, 2, 3)),
)
PIPELINES = {"tiny": TINY}


@dataclass
class RunSpec:
    """What `rlfleet run` was asked; stored in run.json so --resume repeats it exactly."""

    pipeline: str = "tiny"
    engine: str = "vllm"
    model: str | None = None
    """Starting model instead of the pipeline's (a bundled name, a HF folder or a Hugging Face id)."""
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> RunSpec:
        return cls(**json.loads(path.read_text()))


@dataclass
class StageProgress:
    """What the progress display needs after each poll of a running stage."""

    stage: str
    index: int
    total_stages: int
    step: int
    max_steps: int
    phase: str
    reward: float | None = None


Progress = Callable[[StageProgress], None]


Preflight = Callable[["RunSpec"], object]
"""Checks of the machine for a run of this spec (`rlfleet run` passes the doctor's); it
raises to stop the run before anything is written or started."""


def start_run(
    out: Path,
    spec: RunSpec,
    resume: bool,
    pipeline: Pipeline | None = None,
    preflight: Preflight | None = None,
) -> tuple[RunSpec, Pipeline]:
    """Check the run folder against --resume, the overrides against every stage's recipe
    and then the machine (`preflight`), before anything is written; return the spec to run
    and its pipeline."""
    run_file = PipelineFolder(out).run_spec
    if resume:
        if not run_file.exists():
            raise PipelineError(
                f"--resume: {out} holds no run (no run.json); start one with `rlfleet run "
                f"--out {out}`"
            )
        stored = RunSpec.load(run_file)
        if (spec.overrides and spec.overrides != stored.overrides) or (
            spec.model and spec.model != stored.model
        ):
            raise PipelineError(
                f"--resume continues the run as it was started (model {stored.model}, "
                f"overrides {stored.overrides}); drop --model and the overrides or start a "
                "new run with --out"
            )
        if preflight is not None:
            preflight(stored)
        return stored, pipeline_of(stored, pipeline)
    if run_file.exists():
        raise PipelineError(
            f"{out} already holds a run; continue it with `rlfleet run --resume --out {out}` "
            "or choose another folder with --out"
        )
    chosen = pipeline_of(spec, pipeline)
    for index, stage in enumerate(chosen.stages):  # a bad override fails here, not later
        stage_recipe(chosen, index, out, data_dir(out, stage), spec.overrides)
    if preflight is not None:
        preflight(spec)
    out.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return spec, chosen


def pipeline_of(spec: RunSpec, pipeline: Pipeline | None = None) -> Pipeline:
    if pipeline is None:
        if spec.pipeline not in PIPELINES:
            raise PipelineError(f"pipeline {spec.pipeline!r}: known: {', '.join(PIPELINES)}")
        pipeline = PIPELINES[spec.pipeline]
    return replace(pipeline, model=spec.model) if spec.model else pipeline


def data_dir(out: Path, stage: PipelineStage) -> Path:
    """Where the stage's blend is prepared: <out>/data/<blend name>."""
    try:
        name, _ = resolve_blend(stage.blend)  # the name prepare_rl writes under
    except DataError as exc:
        raise PipelineError(f"stage {stage.name}: {exc}") from None
    return PipelineFolder(out).blend(name)


def prepare_data(pipeline: Pipeline, out: Path) -> dict[str, Path]:
    """Each stage's blend prepared once under <out>/data (kept across --resume)."""
    prepared: dict[str, Path] = {}
    for stage in pipeline.stages:
        target = data_dir(out, stage)
        if not (target / BLEND_MANIFEST).exists():
            options = PrepOptions(
                out=PipelineFolder(out).data, val_rows=pipeline.val_rows, force=True
            )
            try:
                target, _ = prepare_rl(stage.blend, options)
            except DataError as exc:
                raise PipelineError(f"stage {stage.name}: data prep failed: {exc}") from None
        prepared[stage.name] = target
    return prepared


def stage_recipe(
    pipeline: Pipeline,
    index: int,
    out: Path,
    data_dir: Path,
    overrides: Sequence[str],
) -> RecipeConfig:
    """The stage's recipe with the pipeline's wiring: data paths, and the starting model
    (the pipeline's model, or the previous stage's HF export)."""
    stage = pipeline.stages[index]
    model = (
        pipeline.model
        if index == 0
        else str(PipelineFolder(out).stage(pipeline.stages[index - 1].name).hf)
    )
    wiring = [
        format_override("data.train_path", data_dir / "train" / "data.jsonl"),
        format_override("data.val_path", data_dir / "val" / "data.jsonl"),
        format_override("policy.model", model),
        "checkpoint.export_hf=true",
    ]
    return load_recipe(stage.recipe, [*wiring, *overrides])


def stage_done(stage_dir: Path) -> bool:
    return StageFolder(stage_dir).finished()


def stage_result(stage: PipelineStage, stage_dir: Path, wall_s: float) -> StageResult:
    return stage_result_from_folder(stage.name, stage_dir, wall_s)


def stage_lineage(recipe: RecipeConfig, recipe_name: str, stage_dir: Path) -> dict[str, Any]:
    """Where a stage's weights come from and what they are trained on: the starting model
    as the recipe names it and, for a folder (an earlier stage's export), its absolute
    path; the rows; where the stage writes its own export."""
    folder = StageFolder(stage_dir)
    parent = Path(recipe.policy.model).expanduser()
    data: dict[str, Any] = {"train_path": recipe.data.train_path, "val_path": recipe.data.val_path}
    if recipe.data.train_path:  # a prepared blend: <blend>/train/data.jsonl + manifest
        manifest = Path(recipe.data.train_path).parent.parent / BLEND_MANIFEST
        if manifest.is_file():
            prepared = json.loads(manifest.read_text())
            data |= {"dir": str(manifest.parent), "sources": prepared.get("sources", {})}
            data["splits"] = prepared.get("splits", {})
    return {
        "stage": recipe.stage,
        "recipe": recipe_name,
        "parent_model": recipe.policy.model,
        "parent_model_path": str(parent.resolve()) if parent.is_dir() else None,
        "data": data,
        "output": {"hf": str(folder.hf), "checkpoints": str(folder.checkpoints())},
    }


def write_lineage(stage_dir: Path, recipe: RecipeConfig, recipe_name: str, **extra: str) -> None:
    """<stage_dir>/lineage.json: stage_lineage, plus `extra` (a pipeline's stage and blend
    names). Written before the trainer starts, by `rlfleet run` and `rlfleet rl` alike."""
    lineage = {**stage_lineage(recipe, recipe_name, stage_dir), **extra}
    StageFolder(stage_dir).lineage.write_text(json.dumps(lineage, indent=2) + "\n")


class TrainerProcess:
    """One stage's trainer as a child process in its own session (so Ctrl-C reaches only
    this supervisor, which then stops it)."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        return tail_lines(self.log_path, lines)


def run_stage(
    stage_dir: Path,
    recipe: RecipeConfig,
    targets: dict[str, str],
    resume: bool,
    on_poll: Callable[[list[dict[str, Any]], str], None],
    poll_s: float = 1.0,
) -> None:
    """Train one stage to completion; raises PipelineError if the trainer fails."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    folder = StageFolder(stage_dir)
    recipe_file = folder.recipe_yaml
    recipe_file.write_text(dump_yaml(recipe))
    extra = [f"services.{name}={target}" for name, target in sorted(targets.items())]
    if resume:
        extra.insert(0, "--resume")
    trainer = TrainerProcess(trainer_command(recipe_file, stage_dir, extra), folder.trainer_log)
    try:
        while trainer.process.poll() is None:
            on_poll(read_metrics(folder.metrics), current_phase(stage_dir))
            time.sleep(poll_s)
    finally:
        trainer.stop()
    on_poll(read_metrics(folder.metrics), "done")
    if trainer.process.returncode != 0:
        raise PipelineError(
            f"stage {recipe.stage}: the trainer {trainer_end(trainer.process.returncode)}; "
            f"last lines of {trainer.log_path}:\n{trainer.log_tail()}"
        )


def current_phase(stage_dir: Path) -> str:
    heldout = StageFolder(stage_dir).heldout
    if not heldout.exists():
        return "starting"
    return "training" if "after" not in json.loads(heldout.read_text()) else "finishing"


def run_pipeline(
    out: Path,
    spec: RunSpec,
    *,
    resume: bool,
    progress: Progress | None = None,
    log: Callable[[str], None] = print,
    pipeline: Pipeline | None = None,
    preflight: Preflight | None = None,
) -> Path:
    """Run (or continue) the pipeline in `out` (`spec.pipeline`, unless `pipeline` is
    given); returns the report's path. `preflight` checks the machine first."""
    spec, pipeline = start_run(out, spec, resume, pipeline, preflight)
    data = prepare_data(pipeline, out)
    recipes = [
        stage_recipe(pipeline, i, out, data[s.name], spec.overrides)
        for i, s in enumerate(pipeline.stages)
    ]
    walls = read_walls(out)
    pending = [i for i, s in enumerate(pipeline.stages) if not stage_done(stage_path(out, s))]
    if pending:
        log(f"starting {', '.join(pipeline.services)} (logs in {PipelineFolder(out).logs})")
        overrides = {"rollout": [f"engine={spec.engine}", format_override("model", pipeline.model)]}
        with LocalFleet(pipeline.services, out, overrides=overrides) as fleet:
            targets = {"rollout": fleet.target("rollout"), "reward": fleet.target("reward")}
            for index in pending:
                stage, recipe = pipeline.stages[index], recipes[index]
                stage_dir = stage_path(out, stage)
                started = time.monotonic()

                def on_poll(rows: list[dict[str, Any]], phase: str, index: int = index) -> None:
                    if progress is not None:
                        progress(
                            StageProgress(
                                stage=pipeline.stages[index].name,
                                index=index,
                                total_stages=len(pipeline.stages),
                                step=int(rows[-1]["step"]) if rows else 0,
                                max_steps=recipes[index].grpo.max_num_steps,
                                phase=phase,
                                reward=float(rows[-1].get("reward/mean", 0.0)) if rows else None,
                            )
                        )

                stage_dir.mkdir(parents=True, exist_ok=True)
                write_lineage(
                    stage_dir.resolve(), recipe, stage.recipe, stage=stage.name, blend=stage.blend
                )
                resuming = resume and StageFolder(stage_dir).checkpoints().exists()
                run_stage(stage_dir, recipe, targets, resuming, on_poll)
                walls[stage.name] = walls.get(stage.name, 0.0) + time.monotonic() - started
                PipelineFolder(out).walls.write_text(json.dumps(walls, indent=2) + "\n")
    results = [stage_result(s, stage_path(out, s), walls.get(s.name, 0.0)) for s in pipeline.stages]
    log_stage_summaries(out, recipes[0].logger, pipeline.name, results)
    return write_report(out, results)


def stage_path(out: Path, stage: PipelineStage) -> Path:
    return PipelineFolder(out).stage(stage.name).root


def read_walls(out: Path) -> dict[str, float]:
    path = PipelineFolder(out).walls
    return {k: float(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
