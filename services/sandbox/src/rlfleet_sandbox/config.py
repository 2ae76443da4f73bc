"""Configuration of the sandbox service: isolation, limits, warm pool, sessions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from rlfleet_core.config import ConfigModel
from rlfleet_core.raycluster import RayConfig
from rlfleet_core.server import ServiceConfig


class IsolationConfig(ConfigModel):
    """How each sandbox is built (bubblewrap)."""

    bwrap: str = "bwrap"
    """bubblewrap executable (Debian package `bubblewrap`); a name is looked up on PATH."""
    python: str = "/usr/bin/python3"
    """Interpreter used inside the sandbox. It must live under a read-only bound system
    directory (/usr by default) or in `extra_ro_binds`; the system Python is the default so
    that nothing under the service user's home (e.g. a pyenv in /root) is exposed."""
    sandbox_uid: int = Field(65534, ge=1, le=2**31 - 1)
    """Host uid the sandbox processes run as when the service runs as root (bwrap is
    started under this uid, so the user namespace maps the sandbox's only uid to it, never to
    root). Ignored when the service is not root: then the service's own uid is used."""
    sandbox_gid: int = Field(65534, ge=1, le=2**31 - 1)
    """Host gid, as `sandbox_uid`."""
    tmpfs_bytes: int = Field(64 << 20, ge=1 << 20)
    """Size of each writable tmpfs (/tmp holding the work dir, /dev/shm); counts against host RAM."""
    tmpfs_inodes: int = Field(16384, ge=64, le=1 << 24)
    """Files, directories and symlinks each writable tmpfs may hold (its `nr_inodes`).
    Inodes are kernel memory (~1 KB each) that `tmpfs_bytes` does not bound: without this
    a tmpfs allows millions of empty files."""
    seccomp: bool = True
    """Deny dangerous system calls inside the sandbox (io_uring, bpf, userfaultfd,
    perf_event_open, kexec, keyrings, ptrace, mount, unshare, setns, modules, ...) with a
    seccomp filter built by libseccomp (the `libseccomp2` system library). Off only where
    libseccomp is missing, and knowingly: the filter narrows the kernel surface a program
    can attack."""
    ro_binds: list[str] = Field(default_factory=lambda: ["/usr", "/lib", "/lib64", "/bin", "/sbin"])
    """System paths bound read-only (symlinks such as /lib -> usr/lib are recreated as
    symlinks; missing paths are skipped)."""
    extra_ro_binds: list[str] = Field(default_factory=list)
    """More host paths bound read-only at the same place (e.g. a Python outside /usr)."""
    env: dict[str, str] = Field(
        default_factory=lambda: {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": "/tmp/work",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    """The complete environment of sandboxed programs; nothing of the service's leaks in."""
    start_timeout_s: float = Field(10.0, gt=0)
    """A sandbox that is not ready this long after spawning counts as failed."""
    cgroup: Literal["auto", "off"] = "auto"
    """`auto`: where the machine has a writable cgroup v2 hierarchy, each sandbox gets a
    cgroup of its own below the service's (memory.max, pids.max, OOM kills and CPU read
    from it), so the kernel bounds a run's processes together; elsewhere (cgroup v1, no
    delegation) the runner's accounting over the sandbox's process tree does it alone
    (docs/sandbox.md, "Limits of a run"). `off`: the accounting only."""


LIMIT_NAMES = (
    "timeout_s",
    "cpu_time_s",
    "memory_bytes",
    "max_processes",
    "max_file_size_bytes",
    "max_open_files",
    "max_output_bytes",
)
"""The per-run limits a request may set, each with a default and a `max_` cap below."""


class LimitsConfig(ConfigModel):
    """Per-run defaults (used when a request leaves a limit at 0) and caps (requests asking
    for more are clamped). Units are in each name."""

    timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit; the whole process tree is killed after it."""
    max_timeout_s: float = Field(300.0, gt=0)
    cpu_time_s: float = Field(10.0, gt=0)
    """CPU seconds (RLIMIT_CPU, whole seconds, rounded up)."""
    max_cpu_time_s: float = Field(300.0, gt=0)
    memory_bytes: int = Field(1 << 30, ge=32 << 20)
    """Address space (RLIMIT_AS). Threads reserve 64 MiB arenas each, so stay generous."""
    max_memory_bytes: int = Field(8 << 30, ge=32 << 20)
    max_processes: int = Field(64, ge=1)
    """Processes and threads the program may have at once (RLIMIT_NPROC, per sandbox)."""
    max_max_processes: int = Field(512, ge=1)
    max_file_size_bytes: int = Field(16 << 20, ge=0)
    """Largest file the program may write (RLIMIT_FSIZE); the tmpfs size caps the total."""
    max_max_file_size_bytes: int = Field(1 << 30, ge=0)
    max_open_files: int = Field(256, ge=16)
    """Open file descriptors (RLIMIT_NOFILE)."""
    max_max_open_files: int = Field(4096, ge=16)
    max_output_bytes: int = Field(1 << 20, ge=1)
    """Captured bytes of stdout and of stderr each; more stops the program (OUTPUT_LIMIT)."""
    max_max_output_bytes: int = Field(16 << 20, ge=1)

    @model_validator(mode="after")
    def _defaults_within_caps(self) -> LimitsConfig:
        for name in LIMIT_NAMES:
            cap = f"max_{name}"
            if getattr(self, name) > getattr(self, cap):
                raise ValueError(
                    f"{name} ({getattr(self, name)}) must be <= {cap} "
                    f"({getattr(self, cap)}); raise {cap} or lower {name}"
                )
        return self


class PoolConfig(ConfigModel):
    """Warm pool of one-shot sandboxes (a resident runner forks one child per run)."""

    backend: Literal["process", "ray"] = "process"
    """Where sandboxes run: `process`, on this host; `ray`, on the nodes of a Ray cluster
    (`ray.*`), each started by a Ray actor on its node with the same bubblewrap isolation;
    the warm pool and the sessions stay in the service, and a session's cells all go to
    the node holding it (docs/sandbox.md, "Ray mode")."""
    size: int = Field(4, ge=1, le=256)
    """Sandboxes kept started; also the number of one-shot runs executing at once. With
    `backend=ray`, in all, spread over the Ray actors."""
    max_runs_per_sandbox: int = Field(100, ge=1)
    """Runs served by one sandbox before it is replaced. Between runs every process of
    the sandbox is killed and its tmpfs, SysV IPC and keyrings are wiped; 1 gives each run
    a brand-new sandbox (strictest, but each run then pays an interpreter start)."""
    max_waiting: int = Field(1024, ge=0)
    """Runs queued for a free sandbox; more are refused with RESOURCE_EXHAUSTED."""
    kill_grace_s: float = Field(2.0, gt=0)
    """Past a run's timeout, how long the service waits for the runner's own report
    before it kills the whole sandbox itself."""


class SessionsConfig(ConfigModel):
    """Stateful Python sessions, each in its own sandbox."""

    max_sessions: int = Field(32, ge=0)
    """Open sessions at most, all clients together; creating one more is refused
    (RESOURCE_EXHAUSTED / HTTP 429)."""
    max_sessions_per_client: int = Field(8, ge=0)
    """Open sessions at most per client (per `x-rlfleet-client-key`), so one client cannot
    take every slot of `max_sessions`; one more is refused (RESOURCE_EXHAUSTED / HTTP 429)."""
    allow_keyless: bool = True
    """Let calls without an `x-rlfleet-client-key` use sessions, as an unmodified
    NeMo-Skills client does (`session_id` in the body or an `X-Session-ID` header). Their
    sessions live in a namespace of their own, apart from every keyed client's: a keyless
    call never reaches a keyed client's session, nor a keyed call a keyless one. Within
    it the session id is the only capability (NeMo-Skills names sessions with a uuid4), so
    keyless ids are never listed (`GET /sessions` without a key lists nothing). False
    refuses keyless session calls with INVALID_ARGUMENT / HTTP 400."""
    max_keyless_sessions: int = Field(24, ge=0)
    """Open keyless sessions at most, all keyless callers together (they cannot be told
    apart, so `max_sessions_per_client` does not apply to them). Below `max_sessions`
    (24 of the default 32), so keyless callers cannot take the slots keyed clients need.
    One more is refused (RESOURCE_EXHAUSTED / HTTP 429)."""
    idle_timeout_s: float = Field(600.0, gt=0)
    """Default time a session may stay unused before it is closed."""
    max_idle_timeout_s: float = Field(3600.0, gt=0)
    """Cap on a requested idle timeout."""
    reap_interval_s: float = Field(1.0, gt=0)
    """How often idle sessions are looked for."""


class HttpFaceConfig(ConfigModel):
    """Bounds of the NeMo-Skills-compatible HTTP face."""

    max_body_bytes: int = Field(16 << 20, ge=1 << 10)
    """Largest request body; a larger one is refused with HTTP 413 before it is parsed."""
    deadline_s: float = Field(330.0, gt=0)
    """Server-side deadline of one /execute call, waiting for a sandbox included; past
    it the call ends with HTTP 504 and its run is stopped. Must exceed `limits.timeout_s`
    plus `pool.kill_grace_s` (checked at load); runs asking for more than `deadline_s`
    minus the grace are cut short."""


class SandboxServiceConfig(ServiceConfig):
    """Settings of the sandbox service (`server.*` is shared by every service)."""

    isolation: IsolationConfig = IsolationConfig()
    limits: LimitsConfig = LimitsConfig()
    pool: PoolConfig = PoolConfig()
    ray: RayConfig = RayConfig()
    """The Ray cluster of `pool.backend=ray` (unused otherwise)."""
    sessions: SessionsConfig = SessionsConfig()
    http: HttpFaceConfig = HttpFaceConfig()

    @model_validator(mode="after")
    def _http_deadline_covers_a_default_run(self) -> SandboxServiceConfig:
        needed = self.limits.timeout_s + self.pool.kill_grace_s
        if self.http.deadline_s <= needed:
            raise ValueError(
                f"http.deadline_s ({self.http.deadline_s}) must be > limits.timeout_s + "
                f"pool.kill_grace_s ({needed}); raise http.deadline_s"
            )
        return self
