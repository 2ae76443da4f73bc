"""The terminal side shared by every `rlfleet` command: the two consoles, error exits,
the common argument types and the progress bars of `rlfleet run`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rlfleet_core.config import ConfigError

if TYPE_CHECKING:
    from rlfleet_pipeline.pipeline import StageProgress

# soft_wrap: an error is one line, whatever the terminal width (scripts grep for it).
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[KEY=VALUE]...",
        help="Config overrides in Hydra's grammar: key=value (the key must exist, e.g. "
        "grpo.lr=1e-6), +key=value (add a new key), ++key=value (set or add), ~key or "
        "~key=value (delete). Values as Hydra parses them: 3, 1e-6, true, null, a list "
        "\\[a,b], a dict {a:1}, 'quoted' (docs/recipes.md, Overrides).",
        show_default=False,
    ),
]
ConfigPath = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]


def fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]rlfleet:[/] {message}")
    return typer.Exit(code)


def config_failure(exc: ConfigError) -> typer.Exit:
    for line in exc.lines:
        # The line is text (it may hold "[profile]" or a user's value), not rich markup.
        err.print(f"[bold red]rlfleet: config error:[/] {escape(line)}")
    return typer.Exit(2)


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
