"""Configuration of the swe-runner service. Defaults follow the published SWE2 settings
where they apply (test timeout 900 s, container memory 32 GB); tests set small values."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.server import ServiceConfig


class EvalConfig(ConfigModel):
    """How `Evaluate` runs an instance's tests."""

    backend: Literal["docker", "apptainer"] = "docker"
    """docker: one fresh container per call through the Docker engine. apptainer:
    `apptainer exec --containall --writable-tmpfs` over `.sif` paths."""
    docker: str = "docker"
    """Docker CLI executable (a name is looked up on PATH)."""
    apptainer: str = "apptainer"
    """Apptainer executable (a name is looked up on PATH)."""
    test_timeout_s: float = Field(900.0, gt=0)
    """Default time for one call's patch + tests when the request gives none (SWE2: 900 s)."""
    max_test_timeout_s: float = Field(1800.0, gt=0)
    """Upper bound on a request's `timeout_s`."""
    memory_bytes: int = Field(32 << 30, ge=64 << 20)
    """Default container memory cap when the request gives none (SWE2: 32 GB)."""
    max_memory_bytes: int = Field(64 << 30, ge=64 << 20)
    """Upper bound on a request's `memory_bytes`."""
    cpus: float = Field(2.0, gt=0)
    """CPUs per container (docker --cpus / apptainer --cpus)."""
    pids_limit: int = Field(512, ge=16)
    """Processes per container: a fork bomb stops here."""
    disk_bytes: int = Field(10 << 30, ge=1 << 20)
    """What one container may write (docker backend). Docker's `--storage-opt size=` works
    only for overlay2 on xfs with pquota (not this machine's ext4), so two parts: `--ulimit
    fsize` (no single file grows past it: the kernel refuses the write, "File size limit
    exceeded") and a watchdog on the container's writable layer (`docker container inspect
    --size`, every `disk_check_interval_s`) that ends the call once the total is over: an
    Evaluate scores 0 (tests MISSING), a session is closed. The total can overshoot by what
    the container writes in one interval."""
    disk_check_interval_s: float = Field(1.0, gt=0)
    """How often the disk watchdog measures a running container's writable layer."""
    docker_call_timeout_s: float = Field(60.0, gt=0)
    """Deadline of each docker/apptainer call other than the tests themselves (start,
    kill, remove, list)."""
    kill_grace_s: float = Field(5.0, gt=0)
    """apptainer: time between SIGTERM and SIGKILL of a container's process group at the
    deadline."""
    max_concurrent: int = Field(4, ge=1)
    """Calls running at once; more wait in a queue."""
    max_queued: int = Field(64, ge=0)
    """Calls waiting for a slot; beyond that RESOURCE_EXHAUSTED."""
    max_patch_bytes: int = Field(4 << 20, ge=1024)
    """Largest `patch` / `test_patch` accepted."""
    protected_files: list[str] = Field(
        default_factory=lambda: [
            # Every file pytest reads its configuration from (pytest 7: .pytest.ini;
            # pytest 9: pytest.toml, .pytest.toml), in any folder: the arguments' folder
            # (`tests/`) is searched first.
            "conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
            "tox.ini", "setup.cfg", "pyproject.toml",
            "sitecustomize.py", "usercustomize.py", "*.pth",
        ]
    )  # fmt: skip
    """File names a patch may not touch (nor any file of the test patch): they can change
    how pytest runs or reports (hooks, addopts, plugins loaded at start-up), so a patch
    touching one is refused (PATCH_FAILED, reward 0). `*.x` matches a suffix."""
    max_output_bytes: int = Field(8 << 20, ge=1 << 16)
    """How much of a container's output the service keeps (the end of it, where pytest's
    summary is); output beyond this is dropped, so a test that prints without end costs
    no memory."""
    log_tail_bytes: int = Field(16384, ge=256)
    """How much of the end of the output `EvaluateResult.log_tail` keeps."""
    foreign_reap_after_s: float = Field(4 * 3600.0, gt=0)
    """A leftover container of this runner group whose owner cannot be checked from here
    (a runner on another host or in another container, perhaps crashed) is removed at
    start once it is this old: past the longest an Evaluate can run (max_test_timeout_s)
    plus a session's longest idle time (sessions.max_idle_timeout_s), with a margin. A
    session a live runner elsewhere keeps busy longer than this is cut off."""
    runner_label: str = Field("swe-runner", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """Value of the `rlfleet.swe.runner` label on this service's containers; at start the
    service removes leftover containers carrying it (from a crash)."""


class SessionsConfig(ConfigModel):
    """Agent mode: sessions in a running container of the instance's image (docker backend;
    limits as in `eval`: memory, CPUs, processes, no network)."""

    max_sessions: int = Field(16, ge=1)
    """Sessions open at once; one more is RESOURCE_EXHAUSTED."""
    max_sessions_per_client: int = Field(8, ge=1)
    """Sessions one client key may hold open at once (so one client cannot take them all)."""
    idle_timeout_s: float = Field(1800.0, gt=0)
    """A session unused this long is closed (SWE2's agent timeout is 1800 s)."""
    max_idle_timeout_s: float = Field(7200.0, gt=0)
    """Upper bound on a request's `idle_timeout_s`."""
    reap_interval_s: float = Field(5.0, gt=0)
    """How often idle sessions are looked for."""
    command_timeout_s: float = Field(300.0, gt=0)
    """Default time limit of one tool call (SWE2: 300 s per command)."""
    max_command_timeout_s: float = Field(1800.0, gt=0)
    """Upper bound on a request's `timeout_s`."""
    max_output_bytes: int = Field(65536, ge=1024)
    """A tool's output is cut to its last this many characters."""
    submit_exclude: list[str] = Field(
        default_factory=lambda: [
            "__pycache__", "*.pyc", "*.pyo", ".pytest_cache", ".mypy_cache", ".ruff_cache",
            ".hypothesis", ".coverage", "*.egg-info",
        ]
    )  # fmt: skip
    """File and folder names (globs) left out of the patch at submit, in any folder:
    what running the tests or tools leaves behind, not the agent's change."""

    @field_validator("submit_exclude")
    @classmethod
    def _plain_names(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern or "/" in pattern or pattern.startswith(":") or "\x00" in pattern:
                raise ValueError(f"{pattern!r}: use a file or folder name or glob, no '/'")
        return value


class SweRunnerServiceConfig(ServiceConfig):
    """Settings of the swe-runner service (`server.*` is shared by every service)."""

    eval: EvalConfig = EvalConfig()
    sessions: SessionsConfig = SessionsConfig()
