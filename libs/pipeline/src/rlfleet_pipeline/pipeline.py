"""`rlfleet run`: a multi-stage pipeline on this machine (rlfleet_pipeline.pipelines: the
six tiny stages by default).

One run folder holds everything:

    <out>/run.json                 what was asked (pipeline, engine, overrides), for --resume
    <out>/data/<blend>/...         prepared train/val splits + manifest per stage blend
    <out>/logs/<service>.log       the services (one fleet for the whole run)
    <out>/stages/<stage>/          the trainer's run dir: recipe, metrics.jsonl, ledger,
                                   checkpoints/, hf/ (export), heldout.json, lineage.json
    <out>/regression/              the final weights on earlier stages' held-out sets
    <out>/report.md|json, plots/   the end-of-run report

One fleet serves the whole run: the rollout starts once (vLLM's start is the slow part)
and each stage starts from the previous stage's exported HF folder, which its trainer
publishes to the rollout before its first sample; services a stage needs are added when
it starts (the swe-runner, the judge's rollout) and stopped when no later stage needs
them (rlfleet_pipeline.stage_plan.pipeline_fleet). Each stage's trainer is a child process (`rlfleet-trainer
run`); its metrics file drives the progress bar. Ctrl-C stops the trainer and the
services; `--resume` skips finished stages and resumes the interrupted one from its last
checkpoint (the trainer's ledger keeps every prompt accounted for). `--from` starts a
new run at a later stage (from --model), `--to` stops after a stage.
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
from rlfleet_dataprep.swe_pivot import BLEND as SWE_PIVOT_BLEND
from rlfleet_dataprep.swe_pivot import prepare_swe_pivot

from rlfleet_pipeline.fleet import LocalFleet, tail_lines
from rlfleet_pipeline.lineage import write_lineage
from rlfleet_pipeline.pipeline_end import REGRESSION_SERVICES, EndMeasures
from rlfleet_pipeline.pipelines import PIPELINES, Pipeline, PipelineStage
from rlfleet_pipeline.preflight import ensure_swe_images
from rlfleet_pipeline.recipes import load_recipe
from rlfleet_pipeline.report import StageResult, read_metrics, write_report
from rlfleet_pipeline.report_sections import end_of_run_sections
from rlfleet_pipeline.run_report import log_stage_summaries, stage_result_from_folder
from rlfleet_pipeline.stage import trainer_command, trainer_end
from rlfleet_pipeline.stage_plan import pipeline_fleet


class PipelineError(RuntimeError):
    """A pipeline problem a user can act on; the message says what and how."""


@dataclass
class RunSpec:
    """What `rlfleet run` was asked; stored in run.json so --resume repeats it exactly."""

    pipeline: str = "tiny"
    engine: str = "vllm"
    model: str | None = None
    """Starting model instead of the pipeline's (a bundled name, a HF folder or a Hugging Face id)."""
    overrides: list[str] = field(default_factory=list)
    first_stage: str | None = None
    """--from: the stage the run starts at (from `model`); None: the first."""

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
        if (
            (spec.overrides and spec.overrides != stored.overrides)
            or (spec.model and spec.model != stored.model)
            or (spec.first_stage and spec.first_stage != stored.first_stage)
        ):
            raise PipelineError(
                f"--resume continues the run as it was started (model {stored.model}, "
                f"overrides {stored.overrides}, from {stored.first_stage or 'the start'}); "
                "drop --model, --from and the overrides or start a new run with --out"
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
    """The pipeline the spec names, from its first stage (--from) on, with its model."""
    if pipeline is None:
        if spec.pipeline not in PIPELINES:
            raise PipelineError(f"pipeline {spec.pipeline!r}: known: {', '.join(PIPELINES)}")
        pipeline = PIPELINES[spec.pipeline]
    if spec.first_stage is not None:
        pipeline = replace(
            pipeline, stages=pipeline.stages[stage_index(pipeline, spec.first_stage, "--from") :]
        )
    return replace(pipeline, model=spec.model) if spec.model else pipeline


def stage_index(pipeline: Pipeline, name: str, flag: str) -> int:
    if name not in pipeline.names():
        raise PipelineError(
            f"{flag} {name}: pipeline {pipeline.name} has stages {', '.join(pipeline.names())}"
        )
    return pipeline.names().index(name)


def data_dir(out: Path, stage: PipelineStage) -> Path:
    """Where the stage's blend is prepared: <out>/data/<blend name>."""
    if stage.blend == SWE_PIVOT_BLEND:
        return PipelineFolder(out).blend(SWE_PIVOT_BLEND)
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
            val_rows = stage.val_rows if stage.val_rows is not None else pipeline.val_rows
            options = PrepOptions(out=PipelineFolder(out).data, val_rows=val_rows, force=True)
            try:
                if stage.blend == SWE_PIVOT_BLEND:  # cut from the bundled demonstrations
                    target, _ = prepare_swe_pivot(PipelineFolder(out).data)
                else:
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
    return load_recipe(stage.recipe, [*wiring, *stage.overrides, *overrides])


def stage_done(stage_dir: Path) -> bool:
    return StageFolder(stage_dir).finished()


def stage_result(stage: PipelineStage, stage_dir: Path, wall_s: float) -> StageResult:
    return stage_result_from_folder(stage.name, stage_dir, wall_s)


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
    service_down: Callable[[], str | None] = lambda: None,
) -> None:
    """Train one stage to completion; raises PipelineError if the trainer fails, or stops
    it when `service_down` names a service that is gone (kill -9, a crash)."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    folder = StageFolder(stage_dir)
    recipe_file = folder.recipe_yaml
    recipe_file.write_text(dump_yaml(recipe))
    extra = [f"services.{name}={target}" for name, target in sorted(targets.items())]
    if resume:
        extra.insert(0, "--resume")
    trainer = TrainerProcess(trainer_command(recipe_file, stage_dir, extra), folder.trainer_log)
    out = stage_dir.parent.parent  # <out>/stages/<stage>
    try:
        while trainer.process.poll() is None:
            on_poll(read_metrics(folder.metrics), current_phase(stage_dir))
            if (down := service_down()) is not None:
                raise PipelineError(
                    f"stage {recipe.stage} stopped: {down}\ncontinue with `rlfleet run "
                    f"--resume --out {out}` (the stage resumes from its last checkpoint)"
                )
            time.sleep(poll_s)
    finally:
        trainer.stop()
    on_poll(read_metrics(folder.metrics), "done")
    if trainer.process.returncode != 0:
        raise PipelineError(
            f"stage {recipe.stage}: the trainer {trainer_end(trainer.process.returncode)}; "
            f"last lines of {trainer.log_path}:\n{trainer.log_tail()}\n"
            f"continue with `rlfleet run --resume --out {out}` (the stage resumes from its "
            "last checkpoint)"
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
    until: str | None = None,
    progress: Progress | None = None,
    log: Callable[[str], None] = print,
    pipeline: Pipeline | None = None,
    preflight: Preflight | None = None,
) -> Path:
    """Run (or continue) the pipeline in `out` (`spec.pipeline`, unless `pipeline` is
    given) up to stage `until` (None: to the end and the end-of-run measurements);
    returns the report's path. `preflight` checks the machine first."""
    if until is not None and not resume:  # before start_run writes the run folder
        stage_index(pipeline_of(spec, pipeline), until, "--to")
    spec, pipeline = start_run(out, spec, resume, pipeline, preflight)
    last = stage_index(pipeline, until, "--to") if until is not None else len(pipeline.stages) - 1
    data = prepare_data(pipeline, out)
    recipes = [
        stage_recipe(pipeline, i, out, data[s.name], spec.overrides)
        for i, s in enumerate(pipeline.stages)
    ]
    walls = read_walls(out)
    done = [stage_done(stage_path(out, s)) for s in pipeline.stages]
    pending = [i for i in range(last + 1) if not done[i]]
    try:
        ensure_swe_images([recipes[i] for i in pending], log)
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    end = EndMeasures(out, pipeline)
    at_end = last == len(pipeline.stages) - 1
    judged = [i for i in range(last + 1) if end.win_rate_due(pipeline.stages[i])]
    regression = at_end and end.regression_due()
    end_needs = REGRESSION_SERVICES if regression else ()
    rollout = pipeline.rollout_settings(spec.engine, recipes)
    plans = pipeline_fleet(recipes, spec.engine, rollout, end_needs)
    work = sorted({*pending, *judged})
    if work or regression:
        first = work[0] if work else last
        plan = plans[first]
        log(f"starting {', '.join(plan.services)} (logs in {PipelineFolder(out).logs})")
        with LocalFleet(plan.services, out, overrides=plan.settings, say=log) as fleet:
            for index in work:
                fleet.change(plans[index].services, plans[index].settings)
                stage, recipe = pipeline.stages[index], recipes[index]
                if index in pending:
                    started = time.monotonic()
                    _train(out, pipeline, index, recipe, fleet, resume, progress)
                    walls[stage.name] = walls.get(stage.name, 0.0) + time.monotonic() - started
                    PipelineFolder(out).walls.write_text(json.dumps(walls, indent=2) + "\n")
                if end.win_rate_due(stage):
                    log(f"{stage.name}: judging its held-out answers against its start ...")
                    rate = end.run_win_rate(stage, _targets(fleet))
                    log(
                        f"{stage.name}: GenRM win rate vs its start {rate['win_rate']:.3f} "
                        f"over {rate['pairs']:.0f} pairs"
                    )
            if regression:
                services = sorted({*fleet.services, *end_needs})
                fleet.change(services, {**fleet.overrides, **plans[-1].settings})
                log("measuring the final weights on earlier stages' held-out sets ...")
                end.run_regression(_targets(fleet))
    if not at_end and until is not None:
        log(f"stopped after {until} (--to); continue with `rlfleet run --resume --out {out}`")
    results = run_results(out, pipeline, last, walls)
    log_stage_summaries(out, recipes[0].logger, pipeline.name, results)
    return write_report(out, results, end_of_run_sections(out, results))


def run_results(
    out: Path, pipeline: Pipeline, last: int, walls: dict[str, float]
) -> list[StageResult]:
    """The report's stages: those up to `last` (--to) and any later one already finished."""
    return [
        stage_result(s, stage_path(out, s), walls.get(s.name, 0.0))
        for i, s in enumerate(pipeline.stages)
        if i <= last or stage_done(stage_path(out, s))
    ]


def lineage_extra(pipeline: Pipeline, index: int) -> dict[str, str | None]:
    """A pipeline stage's names in its lineage: pipeline, stage, blend, parent stage."""
    stage = pipeline.stages[index]
    parent = pipeline.stages[index - 1].name if index > 0 else None
    return {
        "pipeline": pipeline.name,
        "stage": stage.name,
        "blend": stage.blend,
        "parent_stage": parent,
    }


def _targets(fleet: LocalFleet) -> dict[str, str]:
    return {"rollout": fleet.target("rollout"), "reward": fleet.target("reward")}


def _train(
    out: Path,
    pipeline: Pipeline,
    index: int,
    recipe: RecipeConfig,
    fleet: LocalFleet,
    resume: bool,
    progress: Progress | None,
) -> None:
    """One stage: its lineage, then its trainer to the end (resumed from its checkpoint)."""
    stage = pipeline.stages[index]
    stage_dir = stage_path(out, stage)

    def on_poll(rows: list[dict[str, Any]], phase: str) -> None:
        if progress is not None:
            progress(
                StageProgress(
                    stage=stage.name,
                    index=index,
                    total_stages=len(pipeline.stages),
                    step=int(rows[-1]["step"]) if rows else 0,
                    max_steps=recipe.grpo.max_num_steps,
                    phase=phase,
                    reward=float(rows[-1].get("reward/mean", 0.0)) if rows else None,
                )
            )

    stage_dir.mkdir(parents=True, exist_ok=True)
    write_lineage(stage_dir.resolve(), recipe, stage.recipe, **lineage_extra(pipeline, index))
    resuming = resume and StageFolder(stage_dir).checkpoints().exists()
    run_stage(stage_dir, recipe, _targets(fleet), resuming, on_poll, service_down=fleet.exited)


def stage_path(out: Path, stage: PipelineStage) -> Path:
    return PipelineFolder(out).stage(stage.name).root


def read_walls(out: Path) -> dict[str, float]:
    path = PipelineFolder(out).walls
    return {k: float(v) for k, v in json.loads(path.read_text()).items()} if path.exists() else {}
