"""The sandbox engine: what both faces (gRPC, HTTP) call. It routes a run to the warm
pool or to a session, and turns raw facts into an `ExecResult`."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from rlfleet_core.errors import InvalidArgument

from rlfleet_sandbox.config import SandboxServiceConfig
from rlfleet_sandbox.metrics import EXECUTION_SECONDS, EXECUTIONS
from rlfleet_sandbox.pool import WarmPool
from rlfleet_sandbox.ray_pool import RaySandboxes
from rlfleet_sandbox.sandbox import RawRun, SandboxSpec, Spawner, local_spawner
from rlfleet_sandbox.sessions import RESET_NOTE, Session, SessionManager, owner_of
from rlfleet_sandbox.types import (
    ExecRequest,
    ExecResult,
    Language,
    RunFacts,
    RunLimits,
    Status,
    classify,
    resolve_limits,
)

logger = logging.getLogger(__name__)

RUNNER_CPU_ALLOWANCE_S = 0.25
"""CPU of the runner itself (measuring, scrubbing) that a sandbox cgroup's cpu.stat holds
besides the run's: not the program's to pay."""


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    idle_timeout_s: float
    idle_s: float
    calls: int
    created_unix_s: float


class SandboxEngine:
    def __init__(self, config: SandboxServiceConfig) -> None:
        self.config = config
        self.ray: RaySandboxes | None = None
        spawn: Spawner
        if config.pool.backend == "ray":
            # The spec (bwrap, seccomp, bind paths) is built by each node's actor.
            self.ray = RaySandboxes(config.ray, config.isolation)
            spawn = self.ray.spawn
        else:
            spawn = local_spawner(SandboxSpec.from_config(config.isolation))
        self.pool = WarmPool(spawn, config.pool)
        self.sessions = SessionManager(spawn, config.sessions)

    async def start(self) -> None:
        if self.ray is not None:
            await self.ray.start()
        try:
            await self.pool.start()
            await self.sessions.start()
        except BaseException:
            if self.ray is not None:
                await self.ray.stop()
            raise

    async def stop(self) -> None:
        await self.sessions.stop()
        await self.pool.stop()
        if self.ray is not None:
            await self.ray.stop()

    def limits(self, requested: dict[str, float]) -> RunLimits:
        return resolve_limits(requested, self.config.limits)

    async def execute(self, request: ExecRequest) -> ExecResult:
        """Run one program (or one session cell) and say how it went."""
        if not request.code.strip():
            raise InvalidArgument("code", "is empty")
        start = time.monotonic()
        lost = False
        if request.session_id:
            if request.language is not Language.PYTHON:
                raise InvalidArgument(
                    "language", f"sessions run Python only, got {request.language.value}"
                )
            raw, lost = await self.sessions.run(
                request.owner, request.session_id, request, self.config.pool.kill_grace_s
            )
            mode = "session"
        else:
            raw = await self.pool.run(request)
            mode = "oneshot"
        result = to_result(raw, request.limits)
        if raw.node:
            result.extra["ray_node"] = raw.node
        if lost:
            result.stderr += RESET_NOTE
            result.extra["session_reset"] = True
        EXECUTIONS.labels(request.language.value, mode, result.status.value).inc()
        EXECUTION_SECONDS.labels(mode).observe(time.monotonic() - start)
        return result

    def owner(self, client_key: str | None) -> str:
        """The session owner a caller's client key stands for (see sessions.owner_of)."""
        return owner_of(client_key, self.config.sessions.allow_keyless)

    async def create_session(
        self, owner: str, limits: RunLimits, idle_timeout_s: float, session_id: str | None = None
    ) -> Session:
        return await self.sessions.create(owner, limits, idle_timeout_s, session_id)

    async def close_session(self, owner: str, session_id: str) -> bool:
        return await self.sessions.close(owner, session_id)

    def list_sessions(self, owner: str) -> list[SessionInfo]:
        now = time.monotonic()
        return [
            SessionInfo(s.session_id, s.idle_timeout_s, now - s.last_used, s.calls, s.created)
            for s in self.sessions.list(owner)
        ]


def to_result(raw: RawRun, limits: RunLimits) -> ExecResult:
    """ExecResult from what the runner reported and what the service saw."""
    overflow = raw.stdout_overflow or raw.stderr_overflow
    report = raw.report
    cgroup_cpu_over = (
        raw.cgroup_cpu_s is not None
        and raw.cgroup_cpu_s > math.ceil(limits.cpu_time_s) + RUNNER_CPU_ALLOWANCE_S
    )
    if report is None and raw.cgroup_oom_kills and not overflow:
        # The kernel's OOM killer took the runner too: the run's memory, not a crash.
        return ExecResult(
            Status.MEMORY,
            raw.stdout,
            raw.stderr,
            exit_code=-1,
            signal=9,
            wall_time_s=raw.wall_s,
            stdout_truncated=raw.stdout_overflow,
            stderr_truncated=raw.stderr_overflow,
        )
    if report is None:
        # No report: the service killed the sandbox past the deadline (TIMEOUT), or it
        # died under the program (e.g. the program killed its runner): the program's fault
        # unless it never started.
        if raw.backstop_killed:
            status = Status.OUTPUT_LIMIT if overflow else Status.TIMEOUT
        else:
            status = Status.ERROR if raw.wall_s > 0 else Status.SANDBOX_ERROR
        stderr = raw.stderr
        if status is Status.ERROR:
            stderr += (
                b"\n[sandbox] the sandbox ended before the program did (was its runner killed?)\n"
            )
        return ExecResult(
            status,
            raw.stdout,
            stderr,
            exit_code=-1,
            signal=9,
            wall_time_s=raw.wall_s,
            stdout_truncated=raw.stdout_overflow,
            stderr_truncated=raw.stderr_overflow,
        )
    facts = RunFacts(
        exit_code=int(report.get("exit_code", -1)),
        signal=int(report.get("signal", 0)),
        cpu_s=float(report.get("cpu_s", 0.0)),
        timed_out=bool(report.get("timed_out")),
        memory_error=bool(report.get("memory_error")) or raw.cgroup_oom_kills > 0,
        output_overflow=overflow,
        stderr_tail=raw.stderr[-512:],
        cpu_exceeded=bool(report.get("cpu_exceeded")) or cgroup_cpu_over,
    )
    extra: dict[str, Any] = {"max_rss_kb": int(report.get("max_rss_kb", 0))}
    if "memory_peak_bytes" in report:
        extra["memory_peak_bytes"] = int(report["memory_peak_bytes"])
    return ExecResult(
        status=classify(facts, limits),
        stdout=raw.stdout,
        stderr=raw.stderr,
        exit_code=facts.exit_code,
        signal=facts.signal,
        wall_time_s=float(report.get("wall_s", raw.wall_s)),
        cpu_time_s=facts.cpu_s,
        stdout_truncated=raw.stdout_overflow,
        stderr_truncated=raw.stderr_overflow,
        extra=extra,
    )
