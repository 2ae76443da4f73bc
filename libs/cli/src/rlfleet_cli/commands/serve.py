"""`rlfleet serve`, `rlfleet up` and `rlfleet version`: one service in the foreground, a
local fleet until Ctrl-C, and the installed package versions."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rlfleet_core.config import ConfigError, format_override, load_service_config
from rlfleet_core.versions import git_commit, package_version, remote_build
from rlfleet_pipeline.services import KNOWN_SERVICES, ServiceNotFound, get_service

from rlfleet_cli.ui import ConfigPath, Overrides, config_failure, err, fail, out


def version(
    targets: Annotated[
        list[str] | None,
        typer.Argument(help="host:port of running services to ask for their build."),
    ] = None,
) -> None:
    """Print the version of every rlfleet package installed here (and the git commit), or,
    given targets, what build each running service reports (docs/upgrades.md)."""
    if not targets:
        packages = ["rlfleet", "rlfleet-core", "rlfleet-proto", *KNOWN_SERVICES.values()]
        width = max(map(len, packages))
        for package in packages:
            out.print(f"{package:<{width}}  {package_version(package)}")
        out.print(f"{'commit':<{width}}  {git_commit() or 'unknown'}")
        return
    import grpc

    table = Table()
    for column in ("target", "service", "version", "proto", "commit"):
        table.add_column(column)
    failed = False
    for target in targets:
        try:
            info = remote_build(target)
        except grpc.RpcError as exc:
            failed = True
            table.add_row(target, f"[red]{exc.code().name}: {exc.details()}[/]", "", "", "")
            continue
        if info is None:
            table.add_row(target, "?", "before 0.2 (no BuildService)", "?", "unknown")
        else:
            commit = info.git_commit[:12] or "unknown"
            row = (info.service, info.version, info.proto_version, commit)
            table.add_row(target, *row)
    out.print(table)
    if failed:
        raise typer.Exit(1)


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
    host: Annotated[str | None, typer.Option(help="Bind address.  \\[default: 127.0.0.1]")] = None,
    port_file: Annotated[
        Path | None,
        typer.Option(
            help="Once bound, write the bound ports here as JSON {grpc, http, pid} "
            "(atomically): with --port 0, how a launcher learns them without a race."
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="rollout: generation engine, vllm or hf (same as engine=...)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="rollout: a bundled model (smollm2-135m-instruct, tiny), a local HF "
            "folder or a Hugging Face id (HF cache); same as model=..."
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
            definition,
            config,
            [*(overrides or []), *shortcuts],
            port,
            http_port,
            host,
            None if port_file is None else str(port_file),
        )
    except ServiceNotFound as exc:
        raise fail(str(exc)) from None
    except ConfigError as exc:
        raise config_failure(exc) from None
    from rlfleet_core.server import run_service_blocking  # ~0.7 s: not for every CLI command

    raise typer.Exit(run_service_blocking(definition, cfg))


def up(
    services: Annotated[str, typer.Option(help="Comma-separated services to start.")] = ",".join(
        KNOWN_SERVICES
    ),
    run_dir: Annotated[Path, typer.Option(help="Where service logs go.")] = Path("runs/up"),
    judge_model: Annotated[
        str | None,
        typer.Option(
            help="Also serve this model as an LLM judge (a second rollout service, `judge`: "
            "a bundled name, a folder or an HF id) and give the reward gateway its "
            "address (judge.base_url) for genrm_compare and the judge environments."
        ),
    ] = None,
    judge_engine: Annotated[
        str, typer.Option(help="Engine of the judge's rollout service: hf or vllm.")
    ] = "hf",
    judge_max_model_len: Annotated[
        int,
        typer.Option(
            min=64,
            help="Context of the judge's engine (prompt + verdict tokens). A judge reads "
            "its instructions, the conversation and every response it compares, so it "
            "needs more than a policy's 1,024; at most the judge model's own context.",
        ),
    ] = 4096,
) -> None:
    """Start services locally on free loopback ports, print their addresses and the path
    of their auth token, and keep them running until Ctrl-C (then stop them gracefully).

    Every service binds port 0 itself and reports the port it got (no pick-then-bind
    race); all start at once. The start-up report (seconds to bind and to SERVING per
    service) is printed and written to <run-dir>/startup.json. With RLFLEET_CACHE_DIR
    set, every service shares the model and compiled-kernel caches under it
    (docs/architecture.md, "The local fleet"). With --judge-model a second rollout
    service serves that model as the judge, and the reward gateway is wired to its
    OpenAI face with the fleet's token."""
    import threading

    from rlfleet_pipeline.fleet import FleetError, LocalFleet

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # explicit: SIGINT may arrive ignored
        signal.signal(sig, lambda *_: stop.set())
    names = [s.strip() for s in services.split(",") if s.strip()]
    overrides: dict[str, list[str]] = {}
    if judge_model is not None:
        if judge_engine not in ("hf", "vllm"):
            raise fail(f"--judge-engine: {judge_engine!r} is not an engine; use hf or vllm")
        names.append("judge")
        overrides["judge"] = [
            format_override("model", judge_model),
            f"engine={judge_engine}",
            f"engine_config.max_model_len={judge_max_model_len}",
        ]
    try:
        with err.status("starting services..."):
            fleet = LocalFleet(
                names,
                run_dir,
                overrides=overrides,
                say=lambda line: err.print(line, markup=False, highlight=False),
            )
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
    if fleet.token_file is not None:
        # Only the path: the token itself stays off terminals and scrollback.
        out.print(
            f"auth token: {fleet.token_file} (calls other than health need it; "
            f"for clients: export RLFLEET_AUTH_TOKEN_FILE={fleet.token_file})"
        )
    else:
        out.print("auth token: yours (RLFLEET_AUTH_TOKEN_FILE / RLFLEET_AUTH_TOKEN)")
    while not stop.wait(0.5):
        dead = [p.name for p in fleet.processes.values() if p.process.poll() is not None]
        if dead:
            err.print(f"[bold red]rlfleet:[/] {', '.join(dead)} exited; stopping the rest")
            break
    codes = fleet.stop()
    err.print("stopped: " + ", ".join(f"{name} ({code})" for name, code in codes.items()))
