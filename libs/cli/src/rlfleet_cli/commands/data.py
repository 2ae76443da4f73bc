"""`rlfleet data prep rl`: a blend into train/val splits with a manifest, optionally
measured and ordered by the curriculum pass."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer
from rlfleet_core.config import format_override
from rlfleet_pipeline.fleet import FleetError, LocalFleet

from rlfleet_cli.ui import err, fail, out

data_app = typer.Typer(help="Prepare training data.", no_args_is_help=True)
prep_app = typer.Typer(
    help="Turn a blend into train/val splits with a manifest.", no_args_is_help=True
)
data_app.add_typer(prep_app, name="prep")


def start_missing_services(
    stack: ExitStack,
    *,
    model: str,
    engine: str,
    log_dir: Path,
    rollout_url: str | None,
    reward_target: str | None,
) -> tuple[str, str]:
    """(rollout HTTP URL, reward gRPC target) for the curriculum pass: the given ones, and
    a rollout (`engine`, `model`) and reward service started on `stack` for those not
    given (stopped when it closes; logs under `log_dir/logs`)."""
    needed = [n for n, given in (("reward", reward_target), ("rollout", rollout_url)) if not given]
    if needed:
        err.print(
            f"starting {', '.join(needed)} for the curriculum pass (logs in {log_dir / 'logs'})"
        )
        overrides = {"rollout": [f"engine={engine}", format_override("model", model)]}
        fleet = stack.enter_context(LocalFleet(needed, log_dir, overrides=overrides))
        if rollout_url is None:
            rollout_url = f"http://127.0.0.1:{fleet.processes['rollout'].http_port}"
        if reward_target is None:
            reward_target = fleet.target("reward")
    assert rollout_url is not None and reward_target is not None
    return rollout_url, reward_target


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
    default_env: Annotated[
        str | None,
        typer.Option(
            help="Environment of rows that name none (raw NeMo-Gym rows: no env, "
            "agent_ref.name or task_source)."
        ),
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
    rollout_send_token: Annotated[
        bool,
        typer.Option(
            "--rollout-send-token",
            help="Send the fleet token to a --rollout-url beyond loopback too (by default "
            "it goes only to loopback addresses; redirects are never followed).",
            rich_help_panel="Curriculum",
        ),
    ] = False,
) -> None:
    """Fill placeholders, check every row against its reward environment (all bad rows
    listed by file:line; NeMo-Gym agent names mapped to environments), split train/val (last rows held out) and
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
        default_env=default_env,
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
                sample_url, reward_target = start_missing_services(
                    stack,
                    model=curriculum_model,
                    engine=curriculum_engine,
                    log_dir=out_dir / ".curriculum",
                    rollout_url=rollout_url,
                    reward_target=reward,
                )
                generate, score = stack.enter_context(
                    curriculum_services(
                        curriculum,
                        rollout_url=sample_url,
                        reward_target=reward_target,
                        send_token_anywhere=rollout_send_token,
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
