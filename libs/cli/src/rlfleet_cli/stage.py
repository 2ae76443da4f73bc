"""`rlfleet rl <stage> -c <recipe>`: one stage, as a plan (--dry-run) or a run."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from rlfleet_core.config import dump_yaml
from rlfleet_core.recipe import RecipeConfig

from rlfleet_cli.fleet import LocalFleet
from rlfleet_cli.launch.profiles import ComposeProfile, LocalProfile, Profile, SlurmProfile
from rlfleet_cli.launch.slurm import render_sbatch

STAGE_KINDS = ("rlvr", "swe", "rlhf", "grpo")
SERVICES_FOR_STAGE = {
    "rlvr": ["sandbox", "reward", "rollout"],
    "grpo": ["sandbox", "reward", "rollout"],
    "rlhf": ["reward", "rollout"],
    "swe": ["sandbox", "reward", "rollout", "swe-runner"],
}


class StageError(ValueError):
    pass


def check_stage(kind: str, recipe: RecipeConfig, recipe_name: str) -> None:
    if kind not in STAGE_KINDS:
        raise StageError(f"stage {kind!r}: expected one of {', '.join(STAGE_KINDS)}")
    if not recipe.stage.startswith(kind):
        raise StageError(
            f"recipe {recipe_name} is stage {recipe.stage!r}, not {kind!r}; "
            f"use `rlfleet rl {recipe.stage.rstrip('0123456789')} -c {recipe_name}`"
        )


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
    ]


def trainer_command(recipe_file: Path, run_dir: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlfleet_trainer",
        "run",
        "-c",
        str(recipe_file),
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def launch_plan(recipe: RecipeConfig, profile: Profile, run_dir: Path) -> str:
    """What would run, as shell text."""
    kind = next(k for k in STAGE_KINDS if recipe.stage.startswith(k))
    services = SERVICES_FOR_STAGE[kind]
    recipe_file = run_dir / "recipe.yaml"
    if isinstance(profile, SlurmProfile):
        return render_sbatch(
            profile, recipe.stage, ["-c", str(recipe_file), "--run-dir", str(run_dir)]
        )
    if isinstance(profile, ComposeProfile):
        up = [
            "docker",
            "compose",
            "-f",
            profile.compose_file,
            "-p",
            profile.project_name,
            "up",
            "-d",
            "--wait",
            *services,
        ]
        train = trainer_command(
            recipe_file,
            run_dir,
            [
                "services.rollout=127.0.0.1:${ROLLOUT_PORT:-50052}",
                "services.reward=127.0.0.1:${REWARD_PORT:-50053}",
            ],
        )
        return f"{shlex.join(up)}\n{' '.join(train)}\n"
    lines = [
        f"# local: {', '.join(services)} as processes on free loopback ports (logs in {run_dir}/logs)"
    ]
    lines += [
        f"{sys.executable} -m rlfleet_cli.main serve {s} --port <free> --http-port <free>"
        for s in services
    ]
    lines.append(
        shlex.join(
            trainer_command(
                recipe_file, run_dir, ["services.rollout=<rollout>", "services.reward=<reward>"]
            )
        )
    )
    return "\n".join(lines) + "\n"


def run_local(
    recipe: RecipeConfig,
    run_dir: Path,
    resume: bool,
    service_overrides: dict[str, list[str]] | None = None,
) -> int:
    """Start the stage's services locally, train, stop them; returns the trainer's exit code."""
    kind = next(k for k in STAGE_KINDS if recipe.stage.startswith(k))
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe_file = run_dir / "recipe.yaml"
    recipe_file.write_text(dump_yaml(recipe))
    with LocalFleet(SERVICES_FOR_STAGE[kind], run_dir, overrides=service_overrides) as fleet:
        extra = [
            f"services.rollout={fleet.target('rollout')}",
            f"services.reward={fleet.target('reward')}",
        ]
        if resume:
            extra.insert(0, "--resume")
        return subprocess.run(trainer_command(recipe_file, run_dir, extra)).returncode


__all__ = ["LocalProfile", "StageError", "check_stage", "launch_plan", "run_local", "summary"]
