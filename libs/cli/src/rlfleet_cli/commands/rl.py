"""`rlfleet rl <stage> -c <recipe>`: one RL stage from a recipe, locally or under docker
compose, or its resolved recipe and launch plan with --dry-run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rlfleet_core.config import ConfigError, dump_yaml

from rlfleet_cli.ui import Overrides, config_failure, err, fail, out

if TYPE_CHECKING:
    from rlfleet_contracts.recipe import RecipeConfig
    from rlfleet_pipeline.launch.profiles import SlurmProfile


def rl(
    stage: Annotated[str, typer.Argument(help="Stage kind: rlvr, swe, rlhf, grpo or dpo.")],
    config: Annotated[
        str,
        typer.Option(
            "--config",
            "-c",
            help="Recipe: a YAML file or a bundled "
            "name (super3/rlvr1, super3/swe1, super3/swe2, super3/rlhf, "
            "nano3/grpo, tiny/dpo, test).",
        ),
    ],
    run: Annotated[
        str, typer.Option("--run", help="Profile from env.toml: local, compose or a SLURM profile.")
    ] = "local",
    env_toml: Annotated[
        Path | None,
        typer.Option(
            "--env-toml",
            help="The env.toml to read profiles from (default: ./env.toml, then "
            "~/.config/rlfleet/env.toml). A SLURM profile's `setup` lines are taken only "
            "from a file named here (or in RLFLEET_ENV_TOML) or from ~/.config.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            help="Print the resolved recipe and the launch plan, run the start's checks; "
            "start nothing."
        ),
    ] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run folder \\[default: runs/<stage>].")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue the stage from its latest checkpoint.")
    ] = False,
    engine: Annotated[
        str,
        typer.Option(
            "--engine", help="Rollout engine: vllm, or hf (transformers; fast for tiny models)."
        ),
    ] = "vllm",
    keep_up: Annotated[
        bool,
        typer.Option(
            "--keep-up", help="--run compose: leave the containers running after the stage."
        ),
    ] = False,
    overrides: Overrides = None,
) -> None:
    """Run one RL stage from a recipe (or show its plan with --dry-run).

    --run compose starts the stage's services from deploy/compose/compose.yaml
    (`docker compose up --wait`), trains on this host against their published ports and
    brings them down again (see docs/containers.md).

    Locally the services start in parallel on ports they bind themselves; their start-up
    times are printed and written to <out>/startup.json. RLFLEET_CACHE_DIR (or cache_dir
    in the env.toml profile) shares the model and compiled-kernel caches of every process.
    """
    from rich.markup import escape
    from rlfleet_pipeline.caches import use_cache_dir
    from rlfleet_pipeline.launch.profiles import ComposeProfile, LocalProfile, load_profile
    from rlfleet_pipeline.lineage import write_lineage
    from rlfleet_pipeline.preflight import preflight
    from rlfleet_pipeline.recipes import load_recipe
    from rlfleet_pipeline.stage import (
        ComposeError,
        StageError,
        check_stage,
        default_run_dir,
        launch_plan,
        rollout_overrides,
        run_compose,
        run_local,
        shell_exit_code,
        summary,
    )

    try:
        recipe = load_recipe(config, overrides or [])
        check_stage(stage, recipe, config)
        profile = load_profile(run, env_toml)
        service_overrides = rollout_overrides(recipe, engine)
    except ConfigError as exc:
        raise config_failure(exc) from None
    except StageError as exc:
        raise fail(str(exc)) from None
    run_dir = out_dir or default_run_dir(recipe)
    try:
        plan = launch_plan(recipe, profile, run_dir, engine)
        # The checks the start runs: a dry-run passes only when the start would pass them.
        problem = preflight(recipe, profile, run_dir, engine)
    except ValueError as exc:  # StageError, or a profile the plan cannot be rendered from
        plan, problem = "", str(exc)
    if dry_run:
        table = Table(title=f"{config} ({run})", show_header=False)
        for key, value in summary(recipe):
            table.add_row(key, value)
        out.print(table)
        out.print("# resolved recipe")
        out.print(dump_yaml(recipe), end="", markup=False)
        out.print("# launch plan")
        out.print(plan, end="", markup=False)
    if problem is not None:
        raise fail(escape(problem), code=1)
    if dry_run:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    write_lineage(run_dir.resolve(), recipe, config)
    if isinstance(profile, LocalProfile | ComposeProfile):
        use_cache_dir(profile.cache_dir)  # the fleet and the trainer inherit it
    if isinstance(profile, ComposeProfile):
        try:
            code = run_compose(
                recipe,
                profile,
                run_dir,
                resume,
                engine=engine,
                keep_up=keep_up,
                say=lambda line: err.print(f"rlfleet: {line}", markup=False),
            )
        except StageError as exc:
            raise fail(escape(str(exc))) from None
        except ComposeError as exc:
            raise fail(escape(str(exc)), code=1) from None
        raise typer.Exit(code)
    from rlfleet_pipeline.launch.profiles import SlurmProfile

    if isinstance(profile, SlurmProfile):
        raise typer.Exit(_run_slurm(recipe, profile, run_dir, resume, service_overrides))
    started = time.monotonic()
    code = run_local(recipe, run_dir, resume, service_overrides)
    if code == 0:
        _write_report(run_dir, recipe, config, time.monotonic() - started)
        raise typer.Exit(0)
    raise fail(
        escape(trainer_exit_message(recipe.stage, code, run_dir)), code=shell_exit_code(code)
    )


def trainer_exit_message(stage: str, code: int, run_dir: Path) -> str:
    """One line for a trainer that did not finish (how it ended: rlfleet_pipeline.stage)."""
    from rlfleet_pipeline.stage import trainer_end

    if code >= 0:
        return f"stage {stage}: the trainer {trainer_end(code)} (its error is above)"
    return f"stage {stage}: the trainer {trainer_end(code)}; continue with --resume ({run_dir})"


def _write_report(run_dir: Path, recipe: RecipeConfig, config: str, wall_s: float) -> None:
    """The stage's report (report.md, report.json, plots/) in its run folder, as `rlfleet
    run` writes one per pipeline: held-out reward before/after, rewards and failures."""
    from rich.markup import escape
    from rlfleet_contracts.run_folder import StageFolder
    from rlfleet_pipeline.pipeline import stage_result
    from rlfleet_pipeline.pipelines import PipelineStage
    from rlfleet_pipeline.report import write_report

    folder = StageFolder(run_dir)
    if not (folder.heldout.exists() and folder.summary.exists()):
        err.print(f"rlfleet: no report: {run_dir} has no heldout.json/summary.json", markup=False)
        return
    result = stage_result(PipelineStage(recipe.stage, config, ""), run_dir, wall_s)
    report = write_report(run_dir, [result])
    out.print(f"report: {escape(str(report))}")


def _run_slurm(
    recipe: RecipeConfig,
    profile: SlurmProfile,
    run_dir: Path,
    resume: bool,
    service_overrides: dict[str, list[str]],
) -> int:
    """Submit the stage as one heterogeneous job, show its state (spinner) and the
    trainer's log until it ends, scancel it on Ctrl-C; the job's exit code (130 when
    cancelled here)."""
    from rich.markup import escape
    from rlfleet_pipeline.launch.slurm_job import JobState, SlurmError, cancel, follow, submit_stage
    from rlfleet_pipeline.stage import stage_services

    try:
        job = submit_stage(
            recipe, profile, run_dir, stage_services(recipe), service_overrides, resume
        )
    except (SlurmError, ValueError) as exc:
        raise fail(escape(str(exc)), code=1) from None
    err.print(f"rlfleet: submitted job {job.job_id}; logs in {job.log_dir}", markup=False)
    with err.status(f"job {job.job_id}: submitted") as spinner:

        def on_state(state: JobState) -> None:
            spinner.update(f"job {job.job_id}: {state.state}")
            err.print(f"rlfleet: job {job.job_id} {state.state}", markup=False)

        try:
            final = follow(
                job,
                profile.poll_s,
                on_state,
                lambda line: out.print(line, markup=False, highlight=False),
            )
        except KeyboardInterrupt:
            spinner.update(f"job {job.job_id}: cancelling (scancel)")
            try:
                final = cancel(job, profile.poll_s)
            except SlurmError as exc:
                raise fail(escape(str(exc)), code=1) from None
            err.print(f"rlfleet: job {job.job_id} cancelled: {final.state}", markup=False)
            return 130
        except SlurmError as exc:  # the job itself is left alone: it may well still run
            raise fail(
                escape(f"{exc}; stopped following job {job.job_id} (scancel {job.job_id} ends it)"),
                code=1,
            ) from None
    if final.state.startswith("COMPLETED"):
        return 0
    err.print(
        f"rlfleet: job {job.job_id} ended {final.state} (exit {final.exit_code}); "
        f"see {job.log_dir}",
        markup=False,
    )
    return final.exit_code or 1
