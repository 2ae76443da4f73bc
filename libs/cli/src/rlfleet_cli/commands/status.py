"""`rlfleet status [RUN_DIR]`: a live terminal view of a running fleet (service health,
weight versions, queues, tokens/s, trainer lag, reward per environment), refreshing until
Ctrl-C; `--once` prints one table, `--json` one snapshot for scripts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.table import Table

from rlfleet_cli.ui import fail, out

if TYPE_CHECKING:
    from rlfleet_pipeline.fleet_view import Snapshot

RunDir = Annotated[
    Path,
    typer.Argument(
        help="The run folder of the fleet: `rlfleet up --run-dir` (default runs/up), "
        "`rlfleet run --out` or an `rlfleet rl` stage folder. Services are found from its "
        "logs/*.ports.json, the token from its auth_token.",
    ),
]


def status(
    run_dir: RunDir = Path("runs/up"),
    watch: Annotated[
        bool, typer.Option("--watch/--once", help="Refresh until Ctrl-C, or print once.")
    ] = True,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.2)] = 2.0,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one snapshot as JSON (implies --once).")
    ] = False,
) -> None:
    """Show a running fleet: each service's health (SERVING / NOT_SERVING / down and why),
    rollout weight version and replicas, queue depths and calls in flight, tokens/s and
    other rates, trainer step and lag, and reward per environment from the newest
    stage's metrics.jsonl. Every call has a 1 s deadline: a dead service shows as down.
    Exit code 1 with --once/--json when a service is not SERVING."""
    from rlfleet_pipeline.fleet_view import FleetView, NoServices

    view = FleetView(run_dir)
    try:
        snap = view.snapshot()
    except NoServices as exc:
        raise fail(str(exc)) from None
    if as_json:
        out.print_json(json.dumps(snap.to_json()))
    elif not watch:
        out.print(render(snap))
    else:
        from rich.live import Live

        try:
            with Live(render(snap), console=out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    try:
                        snap = view.snapshot()
                    except NoServices as exc:  # the folder was cleaned under us
                        raise fail(str(exc)) from None
                    live.update(render(snap), refresh=True)
        except KeyboardInterrupt:
            return
    if not snap.all_serving:
        raise typer.Exit(1)


def _num(value: float | int | None, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def sparkline(values: list[float], width: int = 60) -> str:
    """The last `width` values as block characters, scaled to their own min..max."""
    values = values[-width:]
    if not values:
        return "-"
    low, high = min(values), max(values)
    bars = "▁▂▃▄▅▆▇█"
    span = (high - low) or 1.0
    line = "".join(bars[round((v - low) / span * (len(bars) - 1))] for v in values)
    return f"{line}  ({low:.3f} .. {high:.3f}, last {values[-1]:.3f})"


def render(snap: Snapshot) -> Group:
    """The snapshot as rich tables (also used by tests)."""
    services = Table(title=f"rlfleet fleet: {snap.run_dir}  ({time.strftime('%H:%M:%S')})")
    for column in ("service", "health", "gRPC", "in flight", "queues", "rates"):
        services.add_column(column)
    for s in snap.services:
        colour = "green" if s.health == "SERVING" else "red"
        health = f"[{colour}]{s.health}[/]" + (f" ({s.reason})" if s.reason else "")
        services.add_row(
            s.name,
            health,
            s.target,
            _num(s.in_flight),
            ", ".join(f"{k} {v:g}" for k, v in s.queues.items()) or "-",
            ", ".join(f"{v:g} {k}" for k, v in s.rates.items()) or "-",
        )
    parts: list[Table] = [services]
    if snap.rollouts:
        rollouts = Table(title="rollout")
        for column in ("service", "weight version", "replicas", "waiting", "running"):
            rollouts.add_column(column)
        for column in ("tokens/s", "tokens", "model"):
            rollouts.add_column(column)
        for r in snap.rollouts:
            rollouts.add_row(
                r.service,
                str(r.weight_version) + (" (paused)" if r.paused else ""),
                str(r.replicas),
                str(r.waiting),
                str(r.running),
                f"{r.tokens_per_s:g}",
                str(r.tokens_generated),
                f"{r.model} ({r.engine})",
            )
        parts.append(rollouts)
    if snap.trainer is not None:
        t = snap.trainer
        trainer = Table(title="trainer")
        for column in ("stage", "phase", "step", "weight version", "versions ahead"):
            trainer.add_column(column)
        trainer.add_column("policy lag mean/max")
        step = _num(t.step) + (f"/{t.total_steps}" if t.total_steps else "")
        lag = f"{_num(t.policy_lag_mean, '{:.2f}')}/{_num(t.policy_lag_max)}"
        trainer.add_row(
            t.stage or "-",
            t.phase or "-",
            step,
            _num(t.weight_version),
            _num(t.versions_ahead),
            lag,
        )
        parts.append(trainer)
    rewards = {**{f"{k} (gateway)": v for k, v in snap.gateway_reward.items()}}
    if snap.reward is not None:
        rewards |= {f"{k} ({snap.reward.stage})": v for k, v in snap.reward.by_env.items()}
    if rewards:
        table = Table(title="reward per environment (latest)")
        table.add_column("environment")
        table.add_column("reward", justify="right")
        for env, value in sorted(rewards.items()):
            table.add_row(env, f"{value:.3f}")
        parts.append(table)
    group = Group(*parts)
    if snap.reward is not None and snap.reward.curve:
        points = [p["reward/mean"] for p in snap.reward.curve if "reward/mean" in p]
        group.renderables.append(
            f"reward/mean over {len(points)} steps of {snap.reward.stage}: {sparkline(points)}"
        )
    for problem in snap.problems:
        group.renderables.append(f"[yellow]{problem}[/]")
    return group
