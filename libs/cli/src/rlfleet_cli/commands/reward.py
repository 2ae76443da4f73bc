"""`rlfleet reward score`: one response scored by a reward environment. It runs the reward
service's own `rlfleet-reward score` in a subprocess, so the CLI imports no service."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Annotated

import typer

from rlfleet_cli.ui import fail

reward_app = typer.Typer(help="Reward environments (needs rlfleet-reward).", no_args_is_help=True)


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
    """Score one response with a reward environment (locally, no service needed); prints JSON."""
    # The reward service scores in its own process: the CLI imports no service package.
    if importlib.util.find_spec("rlfleet_reward") is None:
        raise fail(
            "`rlfleet reward` needs the reward service: `uv sync` in the repository "
            "or `pip install rlfleet-reward`"
        )
    # --flag=value: a response or field that starts with a dash stays a value.
    command = [sys.executable, "-m", "rlfleet_reward", "score", f"--env={env}"]
    command += [f"--response={response}", f"--num-tokens={num_tokens}", f"--timeout-s={timeout_s}"]
    command += [f"--field={item}" for item in field or []]
    command += [f"--sandbox={sandbox}"] if sandbox else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        prefix = "rlfleet-reward: "
        problem = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        if problem.startswith(prefix):  # a bad flag or field: say it as our own error
            raise fail(problem.removeprefix(prefix))
        sys.stderr.write(done.stderr)
        raise typer.Exit(done.returncode)
    sys.stdout.write(done.stdout)
