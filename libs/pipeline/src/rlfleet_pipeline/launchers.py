"""The three launchers (rlfleet_pipeline.launcher has their interface): processes on
loopback ports (fleet.LocalFleet), a compose project (launch/compose.py), one heterogeneous
SLURM job (launch/slurm.py); `launcher_for(profile)` picks a profile's."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.auth import TOKEN_FILE_ENV
from rlfleet_core.config import ConfigError, overrides_variable, read_yaml

from rlfleet_pipeline.caches import use_cache_dir
from rlfleet_pipeline.fleet import wiring
from rlfleet_pipeline.launch.compose import (
    ROLLOUT_ENGINE_VAR,
    ROLLOUT_MODEL_VAR,
    ComposeError,
    token_file_for,
)
from rlfleet_pipeline.launch.profiles import ComposeProfile, LocalProfile, Profile, SlurmProfile
from rlfleet_pipeline.launch.slurm import components, service_commands
from rlfleet_pipeline.launch.slurm_job import (
    JobState,
    SlurmError,
    cancel,
    follow,
    slurm_script,
    submit_stage,
)
from rlfleet_pipeline.launcher import Launcher, PlannedStage, StageRun, StageUI, key_values
from rlfleet_pipeline.services import SERVICE_INSTANCES, service_command
from rlfleet_pipeline.stage import (
    StageError,
    compose_env,
    compose_model_problem,
    compose_stack,
    local_services,
    plan_fleet,
    run_compose,
    run_local,
    stage_services,
    trainer_command,
)

# ${VAR:-default} in a compose command: the value the launcher sets, else the default.
_COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def local_overrides(recipe: RecipeConfig, engine: str) -> dict[str, list[str]]:
    """What LocalFleet passes each service: its wiring, then the stage's overrides."""
    fleet = plan_fleet(recipe, engine)
    return {
        s: [*wiring(s, fleet.services, lambda _: "127.0.0.1:0"), *fleet.given(s)]
        for s in fleet.services
    }


def compose_overrides(
    recipe: RecipeConfig, profile: ComposeProfile, engine: str
) -> dict[str, list[str]]:
    """What each service `run_compose` starts is given, in the order it applies them: the
    overrides in its `environment:`'s RLFLEET_<SERVICE>_OVERRIDES, then the `key=value`
    items of its `command:`; the compose file's variables filled in as `run_compose` sets them."""
    env = compose_env(recipe, engine)

    def fill(text: object) -> str:
        return _COMPOSE_VAR.sub(lambda m: env.get(m.group(1), m.group(2) or ""), str(text))

    path = compose_stack(profile).compose_file
    try:
        services = read_yaml(path).get("services", {})
    except ConfigError as exc:
        raise StageError(f"--run compose: {exc}") from None
    plan = {}
    for name in local_services(recipe):
        spec = services.get(name) or {}
        environment = spec.get("environment") or {}
        program = SERVICE_INSTANCES.get(name, name)
        listed = (
            environment.get(overrides_variable(program)) if isinstance(environment, dict) else None
        )
        try:
            from_env = json.loads(fill(listed)) if listed else []
        except ValueError:
            raise StageError(
                f"--run compose: {path}: {name}'s {overrides_variable(program)} is not JSON"
            ) from None
        args = [fill(a) for a in spec.get("command") or []]
        plan[name] = [*from_env, *key_values(args[1:])]
    return plan


class LocalLauncher(Launcher):
    """The stage's services as processes of this machine on free loopback ports."""

    kind = "local"
    services_here = True

    def plan(self, recipe: RecipeConfig, run_dir: Path, engine: str) -> str:
        fleet = plan_fleet(recipe, engine)
        judge = fleet.given("judge")
        lines = [
            f"# local: {', '.join(fleet.services)} as processes on free loopback ports "
            f"(logs in {run_dir}/logs)"
        ]
        lines += [
            f"{shlex.join(service_command(s))} --port <free> --http-port <free>"
            + (
                f" engine={engine} model={shlex.quote(recipe.policy.model)}"
                if s == "rollout"
                else ""
            )
            + (f" {shlex.join(judge)}   # judge" if s == "judge" else "")
            for s in fleet.services
        ]
        recipe_file = StageFolder(run_dir).recipe_yaml
        wired = ["services.rollout=<rollout>", "services.reward=<reward>"]
        lines.append(shlex.join(trainer_command(recipe_file, run_dir, wired)))
        return "\n".join(lines) + "\n"

    def planned_overrides(
        self, recipe: RecipeConfig, run_dir: Path, engine: str
    ) -> dict[str, list[str]]:
        return local_overrides(recipe, engine)

    def use_caches(self) -> None:
        use_cache_dir(self.profile.cache_dir)

    def run_stage(self, run: StageRun) -> int:
        return run_local(run.recipe, run.run_dir, run.resume, plan_fleet(run.recipe, run.engine))

    def pipeline_notes(self, rollout: list[str]) -> list[str]:
        return [
            "# one local fleet for the run; the rollout starts once: "
            + shlex.join([f"rollout {o}" for o in rollout])
        ]

    def pipeline_stage_plan(self, stage: PlannedStage) -> list[str]:
        fleet = stage.fleet
        lines = [f"#   fleet: {', '.join(fleet.services)}"]
        lines += [
            f"#     {name}: {' '.join(fleet.given(name))}"
            for name in fleet.services
            if fleet.given(name) and name != "rollout"
        ]
        wired = ["services.rollout=<rollout>", "services.reward=<reward>"]
        lines.append(shlex.join(trainer_command(stage.recipe_file, stage.stage_dir, wired)))
        return lines


class ComposeLauncher(Launcher):
    """The stage's services as containers of a compose project; the trainer on this host."""

    kind = "compose"

    def plan(self, recipe: RecipeConfig, run_dir: Path, engine: str) -> str:
        stack = compose_stack(self.profile)
        services = local_services(recipe)
        token = token_file_for(run_dir, os.environ)  # made (0600) by the run if missing
        variables = compose_env(recipe, engine)
        variables = {  # engine, model, token first: what a reader looks for
            ROLLOUT_ENGINE_VAR: variables.pop(ROLLOUT_ENGINE_VAR),
            ROLLOUT_MODEL_VAR: variables.pop(ROLLOUT_MODEL_VAR),
            TOKEN_FILE_ENV: str(token),
            **variables,
        }
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
        up = stack.command(*stack.up_args(self.profile.wait_timeout_s))
        train = trainer_command(
            StageFolder(run_dir).recipe_yaml,
            run_dir,
            [
                "services.rollout=127.0.0.1:${ROLLOUT_PORT:-50052}",
                "services.reward=127.0.0.1:${REWARD_PORT:-50053}",
                "services.weight_transport=grpc_stream",
            ],
        )
        return (
            f"{env} {shlex.join([*up, *services])}\n{env} {' '.join(train)}\n"
            f"{shlex.join(stack.command('down', '--timeout', '10', '--remove-orphans'))}"
            "   # unless --keep-up\n"
        )

    def planned_overrides(
        self, recipe: RecipeConfig, run_dir: Path, engine: str
    ) -> dict[str, list[str]]:
        return compose_overrides(recipe, self.profile, engine)

    def start_problem(self, recipe: RecipeConfig) -> str | None:
        """What `run_compose` refuses before `up`: a model the container cannot serve, no
        Docker engine or compose plugin, an image not built."""
        problem = compose_model_problem(recipe)
        if problem is not None:
            return problem
        stack = compose_stack(self.profile)
        try:
            stack.check_docker()
            stack.check_images(stage_services(recipe))
        except ComposeError as exc:
            return str(exc)
        return None

    def use_caches(self) -> None:
        use_cache_dir(self.profile.cache_dir)

    def run_stage(self, run: StageRun) -> int:
        return run_compose(
            run.recipe,
            self.profile,
            run.run_dir,
            run.resume,
            engine=run.engine,
            keep_up=run.keep_up,
            say=run.ui.say,
        )

    def pipeline_stage_plan(self, stage: PlannedStage) -> list[str]:
        return [
            f"#   compose: the rollout container serves {stage.pipeline_model}; the stage's "
            "trainer publishes its starting weights before its first sample",
            *super().pipeline_stage_plan(stage),
        ]

    def run_pipeline(
        self, out: Path, spec: Any, *, resume: bool, until: str | None, ui: StageUI
    ) -> Path:
        from rlfleet_pipeline.pipeline_compose import run_pipeline_compose

        return run_pipeline_compose(out, spec, self.profile, resume=resume, until=until, say=ui.say)


class SlurmLauncher(Launcher):
    """The stage as one heterogeneous SLURM job: the trainer and each service a component."""

    kind = "slurm"
    explains_its_end = True

    def plan(self, recipe: RecipeConfig, run_dir: Path, engine: str) -> str:
        return slurm_script(recipe, self.profile, run_dir, plan_fleet(recipe, engine, False))

    def planned_overrides(
        self, recipe: RecipeConfig, run_dir: Path, engine: str
    ) -> dict[str, list[str]]:
        fleet = plan_fleet(recipe, engine, serve_judge=False)
        comps = components(self.profile, fleet.services)
        commands = service_commands(self.profile, comps, fleet.settings)
        return {name: key_values(command[1:]) for name, command in commands.items()}

    def trainer_world_size(self, recipe: RecipeConfig) -> int:
        """On SLURM: the trainer component's nodes x tasks per node."""
        trainer = components(self.profile, stage_services(recipe))[0]
        return trainer.nodes * trainer.tasks_per_node

    def run_stage(self, run: StageRun) -> int:
        """Submit the stage as one job, keep its state on a status line and show the
        trainer's log until it ends, scancel it on Ctrl-C; the job's exit code (130 when
        cancelled here). SlurmError (one line) when it cannot be submitted or followed."""
        profile: SlurmProfile = self.profile
        ui, recipe = run.ui, run.recipe
        fleet = plan_fleet(recipe, run.engine, serve_judge=False)
        job = submit_stage(recipe, profile, run.run_dir, fleet, run.resume)
        ui.say(f"submitted job {job.job_id}; logs in {job.log_dir}")
        with ui.status(f"job {job.job_id}: submitted") as update:

            def on_state(state: JobState) -> None:
                update(f"job {job.job_id}: {state.state}")
                ui.say(f"job {job.job_id} {state.state}")

            try:
                final = follow(job, profile.poll_s, on_state, ui.show)
            except KeyboardInterrupt:
                update(f"job {job.job_id}: cancelling (scancel)")
                final = cancel(job, profile.poll_s)
                ui.say(f"job {job.job_id} cancelled: {final.state}")
                return 130
            except SlurmError as exc:  # the job itself is left alone: it may well still run
                raise SlurmError(
                    f"{exc}; stopped following job {job.job_id} (scancel {job.job_id} ends it)"
                ) from None
        if final.state.startswith("COMPLETED"):
            return 0
        ui.say(f"job {job.job_id} ended {final.state} (exit {final.exit_code}); see {job.log_dir}")
        return final.exit_code or 1


LAUNCHERS: dict[type[Any], type[Launcher]] = {
    LocalProfile: LocalLauncher,
    ComposeProfile: ComposeLauncher,
    SlurmProfile: SlurmLauncher,
}


def launcher_for(profile: Profile) -> Launcher:
    """The launcher of a profile (by its kind: env.toml's `launcher = ...`)."""
    return LAUNCHERS[type(profile)](profile)


def launch_plan(recipe: RecipeConfig, profile: Profile, run_dir: Path, engine: str = "vllm") -> str:
    """What would run under `profile`, as shell text."""
    return launcher_for(profile).plan(recipe, run_dir, engine)


def planned_overrides(
    recipe: RecipeConfig, profile: Profile, run_dir: Path, engine: str
) -> dict[str, list[str]]:
    """Each service the plan under `profile` starts -> the `key=value` overrides it is given."""
    return launcher_for(profile).planned_overrides(recipe, run_dir, engine)


__all__ = [
    "LAUNCHERS",
    "ComposeLauncher",
    "LocalLauncher",
    "SlurmError",
    "SlurmLauncher",
    "compose_overrides",
    "launch_plan",
    "launcher_for",
    "local_overrides",
    "planned_overrides",
]
