"""`rlfleet rl <stage> -c <recipe>`: one RL stage from a recipe, locally or under docker
compose, or its resolved recipe and launch plan with --dry-run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rlfleet_core.config import ConfigError, dump_yaml

from rlfleet_cli.ui import Overrides, config_failure, err, fail, out

if TYPE_CHECKING:
    from rlfleet_contracts.recipe import RecipeConfig


def rl(
    stage: Annotated[str, typer.Argument(help="Stage kind: rlvr, swe, rlhf, grpo or dpo.")],
    config: Annotated[
        str,
        typer.Option(
            "--config",
            "-c",
            help="Recipe: a YAML file or a bundled "
            "name (super3/rlvr1, super3/swe1, super3/swe2, super3/rlhf, "
            "nano3/grpo, tiny/dpo, tiny/nemotron-h, test).",
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
        str | None,
        typer.Option(
            "--engine",
            help="Rollout engine: vllm, or hf (transformers; fast for tiny models) "
            "\\[default: the recipe's services.rollout_engine, vllm unless it says].",
        ),
    ] = None,
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
    from rlfleet_pipeline.fleet import FleetError
    from rlfleet_pipeline.launch.compose import ComposeError
    from rlfleet_pipeline.launch.profiles import load_profile
    from rlfleet_pipeline.launch.slurm_job import SlurmError
    from rlfleet_pipeline.launcher import StageRun
    from rlfleet_pipeline.launchers import launcher_for
    from rlfleet_pipeline.lineage import write_lineage
    from rlfleet_pipeline.preflight import preflight
    from rlfleet_pipeline.recipes import load_recipe
    from rlfleet_pipeline.stage import (
        StageError,
        check_stage,
        default_run_dir,
        shell_exit_code,
        summary,
    )

    try:
        recipe = load_recipe(config, overrides or [])
        check_stage(stage, recipe, config)
        launcher = launcher_for(load_profile(run, env_toml))
    except ConfigError as exc:
        raise config_failure(exc) from None
    except StageError as exc:
        raise fail(str(exc)) from None
    run_dir = out_dir or default_run_dir(recipe)
    engine = engine or recipe.services.rollout_engine
    try:
        plan = launcher.plan(recipe, run_dir, engine)
        # The checks the start runs: a dry-run passes only when the start would pass them.
        problem = preflight(recipe, launcher, run_dir, engine)
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
    launcher.use_caches()
    started = time.monotonic()
    try:
        code = launcher.run_stage(
            StageRun(recipe, run_dir, engine, resume=resume, keep_up=keep_up, ui=ConsoleUI())
        )
    except StageError as exc:
        raise fail(escape(str(exc))) from None
    except (ComposeError, SlurmError, FleetError, ValueError) as exc:
        raise fail(escape(str(exc)), code=1) from None
    if code == 0:
        _write_report(run_dir, recipe, config, time.monotonic() - started)
        raise typer.Exit(0)
    if launcher.explains_its_end:
        raise typer.Exit(code)
    raise fail(
        escape(trainer_exit_message(recipe.stage, code, run_dir)), code=shell_exit_code(code)
    )


class ConsoleUI:
    """The launchers' StageUI on this CLI's consoles: lines about the run on stderr, the
    job's own output on stdout, a spinner for the job's state."""

    def say(self, line: str) -> None:
        err.print(f"rlfleet: {line}", markup=False)

    def show(self, line: str) -> None:
        out.print(line, markup=False, highlight=False)

    @contextmanager
    def status(self, text: str) -> Iterator[Callable[[str], None]]:
        with err.status(text) as spinner:
            yield spinner.update


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
