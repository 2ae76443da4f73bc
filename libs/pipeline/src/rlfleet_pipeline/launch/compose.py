"""`rlfleet rl <stage> --run compose`: the stage's services as containers of
deploy/compose/compose.yaml, the trainer as a process on this host.

    REWARD_SANDBOX_TARGET=sandbox:50051 REWARD_SWE_TARGET= \\
    docker compose -f <compose_file> -p <project> up -d --no-deps --wait sandbox reward rollout
    python -m rlfleet_trainer run -c <run>/recipe.yaml --run-dir <run> \\
        services.rollout=127.0.0.1:<published> services.reward=127.0.0.1:<published> \\
        services.weight_transport=grpc_stream
    docker compose -f <compose_file> -p <project> down      (unless --keep-up)

Why the trainer is not a container: it then needs no image of its own (the trainer image
is torch again, minutes to build), it reads the recipe's data and writes its run folder
on this host's filesystem without volume mounts, and it reaches the services through the
ports compose publishes on 127.0.0.1. Weights go to the rollout container over gRPC
(StreamWeights): a gloo/NCCL broadcast would need the container to connect back to the
host, and `shared_file` a folder both can see, so the recipe's weight transport is
replaced by `grpc_stream` here.

Authentication: the services bind 0.0.0.0 in their containers, so they require the fleet
token, mounted as a compose secret from the file named by RLFLEET_AUTH_TOKEN_FILE. Unless
the caller set that variable, the token lives in <run>/auth_token (0600), made once and
reused, so a stack left up with --keep-up still accepts the trainer of a --resume run.

The rollout container serves `policy.model`, which must be a bundled name (`tiny`,
`smollm2-135m-instruct`: built offline inside the container, identical to the trainer's
copy); a host folder is not visible in the container. So must a served judge model
(`judge.model`): the `judge` service (a second rollout container, profile `judge`) serves
it, and the gateway reaches it at http://judge:8000/v1 with the fleet's token.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV, write_token_file

from rlfleet_pipeline.caches import cache_env

ROLLOUT_ENGINE_VAR = "ROLLOUT_ENGINE"
ROLLOUT_MODEL_VAR = "ROLLOUT_MODEL"
"""compose.yaml passes these to the rollout service as `engine=` and `model=`."""
GRPC_PORT = 50051
"""Every image serves gRPC on this container port (compose.yaml publishes it)."""
REWARD_TARGET_VARS = {"sandbox": "REWARD_SANDBOX_TARGET", "swe-runner": "REWARD_SWE_TARGET"}
"""compose.yaml gives the reward gateway `sandbox.target=${REWARD_SANDBOX_TARGET-...}` and
`swe.target=${REWARD_SWE_TARGET-...}`: unset (a plain `up` of all five) each names its
service on the compose network; a stage sets them, empty for a service it does not start."""


OVERRIDES_VARS = {
    "reward": "REWARD_OVERRIDES",
    "judge": "JUDGE_OVERRIDES",
    "rollout": "ROLLOUT_OVERRIDES",
}
"""compose.yaml hands these to the reward gateway, the judge's rollout and the policy's
rollout as their RLFLEET_<SERVICE>_OVERRIDES (a JSON list of key=value overrides): a
stage's (or a pipeline's) own settings, which the fixed `command:` cannot carry."""
JUDGE_PROFILE = "judge"
"""compose.yaml's `judge` service sits in this profile: started only when named."""
JUDGE_URL = "http://judge:8000/v1"
"""The judge's OpenAI face on the compose network (its HTTP face listens on 8000)."""


def reward_target_env(services: Sequence[str]) -> dict[str, str]:
    """The REWARD_*_TARGET variables for a stack that starts `services`."""
    return {
        var: f"{service}:{GRPC_PORT}" if service in services else ""
        for service, var in REWARD_TARGET_VARS.items()
    }


class ComposeError(RuntimeError):
    """A problem with Docker, compose or the images; the message says how to fix it."""


def token_file_for(run_dir: Path, env: Mapping[str, str]) -> Path:
    """The token file the stack of this run mounts: the caller's RLFLEET_AUTH_TOKEN_FILE,
    else <run_dir>/auth_token (not written here: see `ensure_token_file`)."""
    given = env.get(TOKEN_FILE_ENV, "").strip()
    return Path(given).absolute() if given else StageFolder(run_dir).auth_token.absolute()


def ensure_token_file(path: Path, env: Mapping[str, str]) -> None:
    """Make `path` hold a token unless it exists: RLFLEET_AUTH_TOKEN if set, else a fresh
    one (mode 0600). An existing file is kept, so a running stack's token stays valid."""
    if not path.exists():
        write_token_file(path, env.get(TOKEN_ENV, "").strip() or None)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass
class ComposeStack:
    """One compose project: `docker compose -f <file> -p <project> ...` with `env`."""

    compose_file: Path
    project: str
    env: Mapping[str, str] = field(default_factory=dict)

    def process_env(self) -> dict[str, str]:
        """`env` plus the shared cache variables (RLFLEET_CACHE_DIR's, if set), so that
        compose.yaml can mount ${RLFLEET_CACHE_DIR} and pass them to the services."""
        return {**self.env, **cache_env(self.env)}

    def command(self, *args: str) -> list[str]:
        return ["docker", "compose", "-f", str(self.compose_file), "-p", self.project, *args]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                self.command(*args),
                env=self.process_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise ComposeError(
                f"`{' '.join(self.command(*args))}` did not finish within {timeout:.0f} s"
            ) from None

    # --- checks before anything starts --------------------------------------------------

    def check_docker(self) -> None:
        """Docker CLI, a daemon that answers, and the compose v2 plugin."""
        if shutil.which("docker") is None:
            raise ComposeError(
                "no `docker` CLI on PATH: install Docker (apt-get install docker.io) and the "
                "compose plugin (deploy/compose/install-compose.sh); see docs/containers.md"
            )
        try:
            info = subprocess.run(
                ["docker", "info", "--format", "{{.ServerVersion}}"],
                env=dict(self.env),
                capture_output=True,
                text=True,
                timeout=30,
            )
        except subprocess.TimeoutExpired:
            raise ComposeError(
                "the Docker engine did not answer `docker info` within 30 s; check dockerd"
            ) from None
        if info.returncode != 0:
            reason = _last_line(info.stderr or info.stdout)
            raise ComposeError(
                f"no Docker engine answers ({reason}); start one: "
                "`dockerd --ip 127.0.0.1 >/tmp/dockerd.log 2>&1 &` (docs/containers.md)"
            )
        version = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if version.returncode != 0:
            raise ComposeError(
                "the Docker Compose v2 plugin is missing (`docker compose version` failed); "
                "install it with deploy/compose/install-compose.sh"
            )
        if not self.compose_file.is_file():
            raise ComposeError(
                f"compose file {self.compose_file} not found; run from the rlfleet checkout "
                "or set compose_file in the env.toml [compose] profile"
            )

    def images(self, services: Sequence[str]) -> dict[str, str]:
        """service -> image, as compose resolves compose.yaml (variables substituted)."""
        config = self.run("config", "--format", "json")
        if config.returncode != 0:
            raise ComposeError(
                f"{self.compose_file} is not a valid compose file: {_last_line(config.stderr)}"
            )
        defined = json.loads(config.stdout).get("services", {})
        unknown = [s for s in services if s not in defined]
        if unknown:
            raise ComposeError(
                f"{self.compose_file} defines no service {', '.join(unknown)} "
                f"(it has {', '.join(sorted(defined))})"
            )
        return {s: str(defined[s].get("image", "")) for s in services}

    def check_images(self, services: Sequence[str]) -> None:
        missing = []
        for service, image in self.images(services).items():
            found = subprocess.run(
                ["docker", "image", "inspect", image], capture_output=True, timeout=60
            )
            if found.returncode != 0:
                missing.append((service, image))
        if missing:
            names = " ".join(service for service, _ in missing)
            images = ", ".join(image for _, image in missing)
            raise ComposeError(
                f"image(s) {images} not found; build them with "
                f"`deploy/docker/build-images.sh {names}`"
            )

    # --- lifecycle -----------------------------------------------------------------------

    def up(self, services: Sequence[str], wait_timeout_s: float) -> None:
        """Start exactly `services` (--no-deps: compose.yaml's depends_on would add the
        sandbox to every stage that starts the reward gateway) and wait until healthy."""
        started = self.run(*self.up_args(wait_timeout_s), *services, timeout=wait_timeout_s + 120)
        if started.returncode != 0:
            logs = self.run("logs", "--no-color", "--tail", "20", *services).stdout
            raise ComposeError(
                f"`docker compose up` failed (exit {started.returncode}): "
                f"{started.stderr.strip()[-1500:]}\n--- last log lines ---\n{logs.strip()[-3000:]}"
            )

    @staticmethod
    def up_args(wait_timeout_s: float) -> list[str]:
        return ["up", "-d", "--no-deps", "--wait", "--wait-timeout", f"{wait_timeout_s:.0f}"]

    def target(self, service: str) -> str:
        """host:port of the service's published gRPC port."""
        found = self.run("port", service, str(GRPC_PORT))
        address = found.stdout.strip().splitlines()[0] if found.stdout.strip() else ""
        if found.returncode != 0 or ":" not in address:
            raise ComposeError(
                f"{service} publishes no port for {GRPC_PORT}: {_last_line(found.stderr)}"
            )
        host, port = address.rsplit(":", 1)
        if host in ("0.0.0.0", "::", "[::]"):
            host = "127.0.0.1"
        return f"{host}:{port}"

    def save_logs(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        logs = self.run("logs", "--no-color", "--timestamps", timeout=120)
        path.write_text(logs.stdout + logs.stderr)

    def down(self) -> None:
        stopped = self.run("down", "--timeout", "10", "--remove-orphans", timeout=180)
        if stopped.returncode != 0:
            raise ComposeError(
                f"`docker compose down` failed: {_last_line(stopped.stderr)}; "
                f"remove the project by hand: {' '.join(self.command('down'))}"
            )
