"""`rlfleet rl <stage> -c <recipe>`: one stage, as a plan (--dry-run) or a run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from rlfleet_contracts.recipe import STAGE_KINDS, RecipeConfig
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.auth import TOKEN_FILE_ENV
from rlfleet_core.config import dump_yaml
from rlfleet_core.models import BUNDLED_MODELS

from rlfleet_pipeline.fleet import LocalFleet
from rlfleet_pipeline.launch.compose import (
    JUDGE_PROFILE,
    JUDGE_URL,
    OVERRIDES_VARS,
    ROLLOUT_ENGINE_VAR,
    ROLLOUT_MODEL_VAR,
    ComposeError,
    ComposeStack,
    ensure_token_file,
    reward_target_env,
    token_file_for,
)
from rlfleet_pipeline.launch.profiles import ComposeProfile, LocalProfile
from rlfleet_pipeline.stage_plan import (
    ROLLOUT_ENGINES,
    SWE_AGENT_ENV,
    FleetPlan,
    StageError,
    judge_overrides,
    local_services,
    plan_fleet,
    rollout_overrides,
    stage_envs,
    stage_services,
)


def trainer_end(code: int) -> str:
    """How a trainer process ended, for a user: its exit code, or the signal that killed it
    (SIGKILL is most often the kernel's out-of-memory killer, which leaves no line of its own)."""
    if code >= 0:
        return f"exited with code {code}"
    name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
    hint = (
        "; out of memory is the usual cause: lower policy.train_micro_batch_size / "
        "logprob_micro_batch_size, or check `dmesg`"
        if name == "SIGKILL"
        else ""
    )
    return f"was killed by {name}{hint}"


def shell_exit_code(code: int) -> int:
    """A shell's convention: 128 + the signal for a process killed by one."""
    return code if code >= 0 else 128 - code


def check_stage(kind: str, recipe: RecipeConfig, recipe_name: str) -> None:
    if kind not in STAGE_KINDS:
        raise StageError(f"stage {kind!r}: expected one of {', '.join(STAGE_KINDS)}")
    if recipe.kind != kind:
        raise StageError(
            f"recipe {recipe_name} is stage {recipe.stage!r} (kind {recipe.kind}), not {kind!r}; "
            f"use `rlfleet rl {recipe.kind} -c {recipe_name}`"
        )


def default_run_dir(recipe: RecipeConfig) -> Path:
    """Where `rlfleet rl` runs a stage without --out: runs/<stage>. A chained recipe's
    policy.model is the previous stage's export there (StageFolder(...).hf)."""
    return Path("runs") / recipe.stage


def summary(recipe: RecipeConfig) -> list[tuple[str, str]]:
    """The published-table view of a recipe (docs/recipes.md)."""
    g, p, c = recipe.grpo, recipe.policy, recipe.cluster
    return [
        ("stage", recipe.stage),
        ("nodes (GPUs)", f"{c.num_nodes} ({c.num_nodes * c.gpus_per_node})"),
        (
            "generation nodes",
            f"{c.generation_nodes} (colocated={'true' if not c.generation_nodes else 'false'})",
        ),
        ("prompts/step", str(g.num_prompts_per_step)),
        ("generations/prompt", str(g.num_generations_per_prompt)),
        ("batch", f"{recipe.global_batch_size:,}"),
        ("max sequence length", f"{p.max_total_sequence_length:,}"),
        (
            "TP / PP / CP / EP",
            f"{p.tensor_parallel_size} / {p.pipeline_parallel_size} / "
            f"{p.context_parallel_size} / {p.expert_parallel_size}",
        ),
        ("learning rate", f"{g.lr:g}"),
        ("KL penalty", f"{g.kl_coef:g}"),
        ("overlong filtering", str(g.overlong_filtering).lower()),
        ("policy lag (max age)", str(g.max_trajectory_age_steps)),
        *((f"differs: {key}", why) for key, why in recipe.deviations.items()),
    ]


def trainer_command(
    recipe_file: Path, run_dir: Path, extra: list[str], ranks: int | None = None
) -> list[str]:
    """The trainer's command line: a plain process for one rank; for `ranks` > 1 (None =
    the recipe file's policy.world_size: TP × PP × CP × DP) torchrun with one process per rank on this
    node, its own free rendezvous port (--standalone) and policy.max_restarts restarts."""
    ranks, restarts = _ranks_of(recipe_file) if ranks is None else (ranks, 2)
    launcher = [sys.executable]
    if ranks > 1:
        launcher += [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
            "--max-restarts",
            str(restarts),
        ]
    return [
        *launcher,
        "-m",
        "rlfleet_trainer",
        "run",
        "-c",
        str(recipe_file),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def _ranks_of(recipe_file: Path) -> tuple[int, int]:
    """(policy.world_size, policy.max_restarts) of a written recipe; (1, 0) when it is not
    there yet (a rendered plan)."""
    from rlfleet_core.config import load_config

    if not recipe_file.is_file():
        return 1, 0
    policy = load_config(RecipeConfig, recipe_file).policy
    return policy.world_size, policy.max_restarts


def run_local(recipe: RecipeConfig, run_dir: Path, resume: bool, plan: FleetPlan) -> int:
    """Start the stage's fleet locally, train, stop it; returns the trainer's exit code."""
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = StageFolder(run_dir).recipe_yaml
    recipe_file.write_text(dump_yaml(recipe))
    with LocalFleet(plan.services, run_dir, overrides=plan.settings) as fleet:
        extra = [
            f"services.rollout={fleet.target('rollout')}",
            f"services.reward={fleet.target('reward')}",
        ]
        if resume:
            extra.insert(0, "--resume")
        return subprocess.run(trainer_command(recipe_file, run_dir, extra)).returncode


def compose_stack(profile: ComposeProfile, env: Mapping[str, str] | None = None) -> ComposeStack:
    """The profile's compose project; a relative compose_file is taken from the current
    folder, else (the default only) from the checkout this CLI is installed from."""
    path = Path(profile.compose_file)
    default = ComposeProfile.model_fields["compose_file"].default
    if not path.is_absolute() and not path.is_file() and profile.compose_file == default:
        checkout = Path(__file__).resolve().parents[4] / path
        if checkout.is_file():
            path = checkout
    return ComposeStack(path.absolute(), profile.project_name, dict(env or os.environ))


def compose_model_problem(recipe: RecipeConfig) -> str | None:
    served = [("policy.model", recipe.policy.model)]
    if recipe.judge.served and recipe.judge.model is not None:
        served.append(("judge.model", recipe.judge.model))
    for key, model in served:
        if model not in BUNDLED_MODELS:
            return (
                f"{key}={model}: a rollout container can only serve a bundled model "
                f"({', '.join(BUNDLED_MODELS)}), not a folder or HF cache of this host; "
                "use --run local"
            )
    return None


def compose_env(recipe: RecipeConfig, engine: str) -> dict[str, str]:
    """The variables compose.yaml reads for this stage: the rollout's engine and model, the
    gateway's targets, and the stage's own overrides of the gateway (judge, episode
    limits) and of the judge's rollout (as JSON lists), with the judge's profile when the
    stage serves one."""
    plan = plan_fleet(recipe, engine)
    reward = plan.given("reward")
    env = {
        ROLLOUT_ENGINE_VAR: engine,
        ROLLOUT_MODEL_VAR: recipe.policy.model,
        **reward_target_env(plan.services),
    }
    if "judge" in plan.services:
        reward = [f"judge.base_url={JUDGE_URL}", "judge.fleet_token=true", *reward]
        env["COMPOSE_PROFILES"] = JUDGE_PROFILE
    env[OVERRIDES_VARS["reward"]] = json.dumps(reward)
    env[OVERRIDES_VARS["judge"]] = json.dumps(plan.given("judge"))
    return env


def run_compose(
    recipe: RecipeConfig,
    profile: ComposeProfile,
    run_dir: Path,
    resume: bool,
    *,
    engine: str = "vllm",
    keep_up: bool = False,
    say: Callable[[str], None] = print,
) -> int:
    """`docker compose up --wait` the stage's services, train against their published
    loopback ports, save the containers' logs to <run_dir>/logs/compose.log and bring the
    project down (unless keep_up). Returns the trainer's exit code; raises ComposeError
    (one line saying how to fix) when Docker, compose or an image is missing."""
    services = local_services(recipe)
    if engine not in ROLLOUT_ENGINES:
        raise StageError(f"rollout engine {engine!r}: expected one of {', '.join(ROLLOUT_ENGINES)}")
    problem = compose_model_problem(recipe)
    if problem is not None:
        raise StageError(problem)
    token_file = token_file_for(run_dir, os.environ)
    env = {**os.environ, TOKEN_FILE_ENV: str(token_file)}
    stack = compose_stack(profile, {**env, **compose_env(recipe, engine)})
    stack.check_docker()
    stack.check_images(services)
    overrides = []
    if recipe.services.weight_transport != "grpc_stream":
        say(
            f"services.weight_transport={recipe.services.weight_transport} cannot reach the "
            "rollout container; using grpc_stream"
        )
        overrides.append("services.weight_transport=grpc_stream")
    run_dir.mkdir(parents=True, exist_ok=True)
    ensure_token_file(token_file, env)
    recipe_file = StageFolder(run_dir).recipe_yaml
    recipe_file.write_text(dump_yaml(recipe))
    say(
        f"compose project {stack.project}: starting {', '.join(services)} "
        f"(rollout engine={engine} model={recipe.policy.model}"
        + (f", judge {recipe.judge.model}" if "judge" in services else "")
        + f") from {stack.compose_file}"
    )
    started = time.monotonic()
    try:
        stack.up(services, profile.wait_timeout_s)
        extra = [
            f"services.rollout={stack.target('rollout')}",
            f"services.reward={stack.target('reward')}",
            *overrides,
        ]
        if resume:
            extra.insert(0, "--resume")
        say(f"services healthy after {time.monotonic() - started:.0f} s; training ({run_dir})")
        started = time.monotonic()
        code = subprocess.run(trainer_command(recipe_file, run_dir, extra), env=env).returncode
        say(f"trainer exited with {code} after {time.monotonic() - started:.0f} s")
        return code
    finally:
        try:
            stack.save_logs(StageFolder(run_dir).logs / "compose.log")
        except (ComposeError, OSError) as exc:
            say(f"could not save the containers' logs: {exc}")
        if keep_up:
            say(
                f"left running (--keep-up; its token: {token_file}); "
                f"stop with: {shlex.join(stack.command('down'))}"
            )
        else:
            started = time.monotonic()
            stack.down()
            say(f"compose project {stack.project} down in {time.monotonic() - started:.0f} s")


__all__ = [
    "ROLLOUT_ENGINES",
    "STAGE_KINDS",
    "SWE_AGENT_ENV",
    "ComposeError",
    "FleetPlan",
    "LocalProfile",
    "StageError",
    "check_stage",
    "compose_env",
    "default_run_dir",
    "judge_overrides",
    "local_services",
    "plan_fleet",
    "rollout_overrides",
    "run_compose",
    "run_local",
    "stage_envs",
    "stage_services",
    "summary",
]
