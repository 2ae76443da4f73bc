"""`env.toml` run profiles: `rlfleet rl <stage> --run <profile>` picks one.

    [local]
    launcher = "local"

    [compose]
    launcher = "compose"

    [my-cluster]
    launcher = "slurm"
    account = "llm"
    partition = "batch"
    gpus_per_node = 8
    container_runtime = "pyxis"
    mounts = ["/lustre:/lustre"]
    [my-cluster.images]
    trainer = "/lustre/images/rlfleet-trainer.sqsh"

The file is the one named (`--env-toml`, else RLFLEET_ENV_TOML), else ./env.toml, then
~/.config/rlfleet/env.toml; `local` and `compose` exist even without one. A SLURM
profile's `setup` lines run as you in every task of the job, so they are taken only from
a file you named or from your own ~/.config/rlfleet/env.toml, never from an env.toml that
happens to sit in the current folder (a cloned repository, a shared project folder).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError
from rlfleet_core.config import ConfigError, ConfigModel, format_validation_error

SERVICES = ("trainer", "rollout", "reward", "sandbox", "swe-runner")
ENV_TOML_ENV = "RLFLEET_ENV_TOML"
"""Names the env.toml to use, as `--env-toml` does (a named file's `setup` is trusted)."""
CWD_ENV_TOML = Path("env.toml")


class LocalProfile(ConfigModel):
    launcher: Literal["local"] = "local"
    cache_dir: str | None = None
    """Shared cache folder (models, HF hub, compiled kernels, uv) for every process of
    the run; RLFLEET_CACHE_DIR in the environment wins (`rlfleet_pipeline.caches`)."""


class ComposeProfile(ConfigModel):
    launcher: Literal["compose"] = "compose"
    compose_file: str = "deploy/compose/compose.yaml"
    """Relative paths are taken from the current folder (the default, when not found
    there, from the rlfleet checkout this CLI runs from)."""
    project_name: str = "rlfleet"
    """`docker compose -p`: containers, network and `down` are per project."""
    wait_timeout_s: int = Field(600, ge=10)
    """How long `up --wait` may take for every service to turn healthy."""
    cache_dir: str | None = None
    """Shared cache folder of the host-side processes (the trainer) and, for compose.yaml
    to mount, of the stack's environment; RLFLEET_CACHE_DIR wins."""


class NodeCounts(ConfigModel):
    """Nodes per service in the heterogeneous job (CPU-only services share CPU nodes)."""

    trainer: int = Field(1, ge=1)
    rollout: int = Field(1, ge=1)
    reward: int = Field(1, ge=1)
    sandbox: int = Field(1, ge=0)
    """0 = run the sandbox on the reward nodes."""
    swe_runner: int = Field(0, ge=0)
    """0 = no SWE runner (RLVR/RLHF stages)."""


class SlurmProfile(ConfigModel):
    """One heterogeneous SLURM job per stage (docs/slurm.md; deploy/slurm/env.toml.example)."""

    launcher: Literal["slurm"] = "slurm"
    account: str | None = None
    """`#SBATCH --account`; None = the submitter's default account."""
    partition: str | None = None
    """Partition for the GPU services (trainer, rollout); None = the cluster's default."""
    cpu_partition: str | None = None
    """Partition for CPU-only services (reward, sandbox, swe-runner); default `partition`."""
    time: str | None = "04:00:00"
    """`#SBATCH --time`; None = the partition's limit."""
    gpus_per_node: int = Field(8, ge=0)
    """GPUs the trainer and rollout components ask for per node (0 = none: CPU clusters)."""
    trainer_tasks_per_node: int | None = Field(None, ge=1)
    """Trainer ranks per node (one srun task each, with RANK/WORLD_SIZE/LOCAL_RANK set
    from SLURM); None = gpus_per_node (1 when that is 0)."""
    master_port: int = Field(29500, ge=1, le=65535)
    """MASTER_PORT of the trainer's ranks (MASTER_ADDR is the trainer's first node)."""
    exclusive: bool = True
    """`#SBATCH --exclusive` on every component: no other job shares its nodes. False
    lets components share a node (a one-node cluster must, to hold every service)."""
    nodes: NodeCounts = NodeCounts()
    container_runtime: Literal["pyxis", "apptainer", "none"] = "pyxis"
    """pyxis: srun --container-image (enroot squashfs); apptainer: `apptainer exec <.sif>`;
    none: the node's own environment (rlfleet installed there, e.g. by `setup`)."""
    images: dict[str, str] = Field(default_factory=dict)
    """Per-service image: .sqsh / docker:// URI for pyxis, .sif path for apptainer."""
    mounts: list[str] = Field(default_factory=list)
    """host:container bind mounts (shared filesystem for checkpoints and data)."""
    cache_dir: str | None = None
    """Shared cache folder (models, HF hub, compiled kernels, uv) on a filesystem every
    node sees (and mounted in the containers at the same path): the job exports
    RLFLEET_CACHE_DIR and the caches' variables for every task; an RLFLEET_CACHE_DIR in
    the submitter's environment wins (`rlfleet_pipeline.caches`)."""
    setup: list[str] = Field(default_factory=list)
    """Shell lines run on each node before its service starts (inside the container for
    pyxis), e.g. `source /shared/rlfleet/.venv/bin/activate` for container_runtime=none."""
    job_dir: str = "runs/slurm"
    """Where the job writes logs and the service address file (must be shared); relative
    paths are taken from the folder `rlfleet rl` runs in (the job's working folder)."""
    grpc_port: int = Field(50051, ge=1, le=65535 - 4)
    """Base gRPC port: rollout listens on +1, reward +2, sandbox +3, swe-runner +4, so
    that components sharing a node do not collide."""
    start_timeout_s: int = Field(1800, ge=10)
    """How long the trainer waits for every service to publish its address; past it (or
    as soon as a service's step exits) the job fails naming the service and its log."""
    poll_s: float = Field(5.0, gt=0)
    """How often `rlfleet rl --run` asks squeue/sacct for the job's state."""
    sbatch_args: list[str] = Field(default_factory=list)
    """Extra `sbatch` flags (e.g. `--qos=high`), given on the command line at submit."""


Profile = LocalProfile | ComposeProfile | SlurmProfile
LAUNCHERS: dict[str, type[Profile]] = {
    "local": LocalProfile,
    "compose": ComposeProfile,
    "slurm": SlurmProfile,
}
BUILTIN: dict[str, Profile] = {"local": LocalProfile(), "compose": ComposeProfile()}


def find_env_toml(explicit: Path | None = None) -> Path | None:
    if explicit is not None:
        return explicit
    named = os.environ.get(ENV_TOML_ENV, "").strip()
    if named:
        return Path(named)
    for candidate in (CWD_ENV_TOML, Path.home() / ".config" / "rlfleet" / "env.toml"):
        if candidate.is_file():
            return candidate
    return None


def _refuse_implicit_setup(path: Path, name: str, profile: Profile) -> None:
    if isinstance(profile, SlurmProfile) and profile.setup:
        raise ConfigError(
            [
                f"{path.resolve()} [{name}] setup: these shell lines would run as you in "
                "every task of the SLURM job, and this env.toml was only found in the "
                "current folder; name it to trust it: --env-toml env.toml (or "
                f"{ENV_TOML_ENV}=env.toml), or keep the profile in ~/.config/rlfleet/env.toml"
            ]
        )


def load_profile(name: str, env_toml: Path | None = None) -> Profile:
    path = find_env_toml(env_toml)
    found_in_cwd = path == CWD_ENV_TOML and env_toml is None and not os.environ.get(ENV_TOML_ENV)
    profiles: dict[str, object] = {}
    if path is not None:
        try:
            profiles = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError([f"{path}: {exc}"]) from None
    if name not in profiles:
        if name in BUILTIN:
            return BUILTIN[name]
        known = sorted({*profiles, *BUILTIN})
        raise ConfigError(
            [
                f"--run {name}: no such profile in {path or 'env.toml (none found)'}; "
                f"known: {', '.join(known)}"
            ]
        )
    table = profiles[name]
    launcher = table.get("launcher") if isinstance(table, dict) else None
    if launcher not in LAUNCHERS:
        raise ConfigError(
            [f"{path} [{name}] launcher: expected one of {', '.join(LAUNCHERS)}, got {launcher!r}"]
        )
    model = LAUNCHERS[launcher]
    try:
        profile = model.model_validate(table)
    except ValidationError as exc:
        lines = format_validation_error(exc, model)
        raise ConfigError([f"{path} [{name}] {line}" for line in lines]) from None
    if found_in_cwd:
        assert path is not None
        _refuse_implicit_setup(path, name, profile)
    return profile
