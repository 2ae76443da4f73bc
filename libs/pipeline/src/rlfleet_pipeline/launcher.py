"""The launcher interface: one launcher per profile kind (`local`, `compose`, `slurm`;
rlfleet_pipeline.launchers) says what a stage's plan looks like under it, what each service
it starts is given, what it checks before a start, how it runs a stage and, where it can,
a pipeline. `launchers.launcher_for(profile)` picks one; the CLI parses and hands over to
it, so a decision about where things run is made in one class, not in a chain of profile
checks across commands.

The services' settings come from the stage's plan (stage_plan.FleetPlan: one set of
`key=value` overrides per service, the same for every launcher); a launcher adds only where the
others are (its wiring) and how it starts them. `planned_overrides` reads back what each
service is really given (the fleet's command lines, the compose file's `command:`, the
sbatch script's lines), so preflight checks what runs, not a second copy of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rlfleet_contracts.recipe import RecipeConfig

from rlfleet_pipeline.stage_plan import FleetPlan, StageError


class NotUnderThisLauncher(StageError):
    """What was asked cannot run under this kind of profile; the message says what can."""


class StageUI(Protocol):
    """How a launcher talks to the person who started the stage (the CLI's console)."""

    def say(self, line: str) -> None:
        """A line about the run (stderr)."""

    def show(self, line: str) -> None:
        """A line of the job's own output (stdout)."""

    def status(self, text: str) -> AbstractContextManager[Callable[[str], None]]:
        """A status line kept up to date while the block runs (calling it updates it)."""


class PrintUI:
    """StageUI on plain print (tests, scripts)."""

    def say(self, line: str) -> None:
        print(line)

    def show(self, line: str) -> None:
        print(line)

    @contextmanager
    def status(self, text: str) -> Iterator[Callable[[str], None]]:
        print(text)
        yield print


@dataclass(frozen=True)
class StageRun:
    """What `run_stage` is asked to run."""

    recipe: RecipeConfig
    run_dir: Path
    engine: str
    resume: bool = False
    keep_up: bool = False
    """compose: leave the services running after the stage."""
    ui: StageUI = field(default_factory=PrintUI)


@dataclass(frozen=True)
class PlannedStage:
    """One stage of a pipeline's `rlfleet run --dry-run`."""

    recipe: RecipeConfig
    stage_dir: Path
    recipe_file: Path
    engine: str
    fleet: FleetPlan
    """The pipeline's one fleet at this stage."""
    pipeline_model: str
    """The model the run starts from (what a compose rollout container serves)."""


class Launcher(ABC):
    """Where and how a stage's services and trainer run."""

    kind: ClassVar[str]
    services_here: ClassVar[bool] = False
    """The services run on this machine (their packages must be installed here)."""
    explains_its_end: ClassVar[bool] = False
    """A failed run_stage has said why already (the CLI adds no line of its own)."""

    def __init__(self, profile: Any) -> None:
        self.profile = profile

    @abstractmethod
    def plan(self, recipe: RecipeConfig, run_dir: Path, engine: str) -> str:
        """What would run, as shell text (`--dry-run`'s launch plan)."""

    @abstractmethod
    def planned_overrides(
        self, recipe: RecipeConfig, run_dir: Path, engine: str
    ) -> dict[str, list[str]]:
        """Each service the plan starts -> the `key=value` overrides it is given."""

    def start_problem(self, recipe: RecipeConfig) -> str | None:
        """What this launcher refuses before anything starts (checked first), or None."""
        return None

    def trainer_world_size(self, recipe: RecipeConfig) -> int:
        """Trainer ranks in one torch.distributed world: torchrun starts policy.world_size
        (TP x PP x CP x DP) ranks."""
        return recipe.policy.world_size

    def use_caches(self) -> None:
        """Point this process's model and kernel caches where the profile says (the fleet
        and the trainer inherit them); a job elsewhere (SLURM) keeps its nodes' own."""
        return None

    @abstractmethod
    def run_stage(self, run: StageRun) -> int:
        """Run the stage; the trainer's (or job's) exit code."""

    def pipeline_notes(self, rollout: list[str]) -> list[str]:
        """Lines of `rlfleet run --dry-run` about the whole run under this launcher."""
        return []

    def pipeline_stage_plan(self, stage: PlannedStage) -> list[str]:
        """A pipeline stage's part of `rlfleet run --dry-run`."""
        return [self.plan(stage.recipe, stage.stage_dir, stage.engine).rstrip("\n")]

    def run_pipeline(
        self, out: Path, spec: Any, *, resume: bool, until: str | None, ui: StageUI
    ) -> Path:
        """Run a pipeline through this launcher's services; its report."""
        raise NotUnderThisLauncher(
            f"a pipeline runs locally or on compose, not under a {self.kind} profile; render "
            "each stage's job with `rlfleet run --dry-run --run <profile>` and submit them "
            "with `rlfleet rl`"
        )


def key_values(args: list[str]) -> list[str]:
    """The `key=value` overrides of a service command line (flags and their values skipped)."""
    found, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = "=" not in arg
        elif "=" in arg:
            found.append(arg)
    return found


__all__ = [
    "Launcher",
    "NotUnderThisLauncher",
    "PlannedStage",
    "PrintUI",
    "StageRun",
    "StageUI",
    "key_values",
]
