"""The service's handle on one sandbox: a bubblewrap'd resident runner (inside/runner.py) and the
control socket to it. Spawning, one run (pipes, deadline, output cap), and killing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Protocol

from rlfleet_sandbox.config import IsolationConfig
from rlfleet_sandbox.inside import runner
from rlfleet_sandbox.isolation import (
    HostPath,
    SandboxCgroup,
    build_bwrap_command,
    find_cgroup_v2_root,
    privilege_drop_prefix,
    probe_host_paths,
    resolve_bwrap,
)
from rlfleet_sandbox.pipes import CappedReader, feed
from rlfleet_sandbox.seccomp import build_filter
from rlfleet_sandbox.types import ExecRequest

logger = logging.getLogger(__name__)

RUNNER_MARK = "rlfleet-sandbox-runner"
"""In every runner's argv, so stray sandboxes can be found in /proc."""
_BWRAP_ENV = {"PATH": "/usr/bin:/bin"}
"""bwrap's own environment. The sandbox's init is bwrap, and its /proc/1/environ is
readable inside, so bwrap must not inherit the service's environment (secrets)."""
_EOF_GRACE_S = 0.5


class SandboxStartError(OSError):
    """A sandbox could not be started (bwrap missing, no user namespaces, ...)."""


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to start sandboxes, resolved once at service start."""

    bwrap: str
    python: str
    host_paths: tuple[HostPath, ...]
    tmpfs_bytes: int
    tmpfs_inodes: int
    seccomp_bpf: bytes
    """The seccomp filter the runner installs (empty: none, `isolation.seccomp=false`)."""
    env: tuple[tuple[str, str], ...]
    prefix: tuple[str, ...]
    """Run before bwrap (the privilege drop when the service is root)."""
    start_timeout_s: float
    cgroup_root: str | None = None
    """Where each sandbox's own cgroup v2 is made (isolation.find_cgroup_v2_root); None:
    no cgroups, the runner's accounting alone bounds a run."""

    @classmethod
    def from_config(cls, config: IsolationConfig) -> SandboxSpec:
        return cls(
            bwrap=resolve_bwrap(config.bwrap),
            python=config.python,
            host_paths=tuple(probe_host_paths([*config.ro_binds, *config.extra_ro_binds])),
            tmpfs_bytes=config.tmpfs_bytes,
            tmpfs_inodes=config.tmpfs_inodes,
            seccomp_bpf=build_filter() if config.seccomp else b"",
            env=tuple(sorted(config.env.items())),
            prefix=tuple(
                privilege_drop_prefix(config.sandbox_uid, config.sandbox_gid, os.geteuid())
            ),
            start_timeout_s=config.start_timeout_s,
            cgroup_root=find_cgroup_v2_root(config.cgroup),
        )

    def command(self, mode: str, ctrl_fd: int, session_limits: dict[str, Any] | None) -> list[str]:
        argv = [
            self.python,
            "-I",
            "-c",
            runner_source(),
            mode,
            str(ctrl_fd),
            json.dumps(
                {
                    "limits": session_limits,
                    "tmpfs_bytes": self.tmpfs_bytes,
                    "tmpfs_inodes": self.tmpfs_inodes,
                    "seccomp": base64.b64encode(self.seccomp_bpf).decode(),
                }
            ),
            RUNNER_MARK,
        ]
        return build_bwrap_command(
            prefix=self.prefix,
            bwrap=self.bwrap,
            host_paths=self.host_paths,
            tmpfs_bytes=self.tmpfs_bytes,
            env=dict(self.env),
            argv=argv,
        )


_SOURCE: list[str] = []


def runner_source() -> str:
    if not _SOURCE:
        _SOURCE.append(
            files(runner.__package__ or "rlfleet_sandbox.inside").joinpath("runner.py").read_text()
        )
    return _SOURCE[0]


@dataclass
class RawRun:
    """What one run produced, before classification."""

    report: dict[str, Any] | None
    """The runner's `done` message; None when the sandbox died or was killed mid-run."""
    stdout: bytes
    stderr: bytes
    stdout_overflow: bool
    stderr_overflow: bool
    backstop_killed: bool
    """The runner did not answer in time and the service killed the whole sandbox."""
    wall_s: float
    node_lost: bool = False
    """The sandbox's Ray node (or its actor) was lost before it answered (ray_pool.py):
    the program may or may not have run."""
    node: str = ""
    """The Ray node that ran it (ray_pool.py); empty in the process mode."""
    cgroup_oom_kills: int = 0
    """Processes the kernel OOM-killed in the sandbox's cgroup during the run."""
    cgroup_cpu_s: float | None = None
    """CPU of the sandbox's cgroup during the run (None: no cgroup)."""


class SandboxHandle(Protocol):
    """What the warm pool and the sessions use of a sandbox: a local `Sandbox`, or one on
    another node of a Ray cluster (ray_pool.RemoteSandbox)."""

    runs: int

    @property
    def alive(self) -> bool: ...

    async def run(self, request: ExecRequest, backstop_s: float) -> RawRun: ...

    async def kill(self) -> None: ...


Spawner = Callable[[str, dict[str, Any] | None], Awaitable[SandboxHandle]]
"""Starts one sandbox: (mode "oneshot" or "session", the session's runner limits)."""


def local_spawner(spec: SandboxSpec) -> Spawner:
    """Sandboxes started by this process."""

    async def spawn(mode: str, session_limits: dict[str, Any] | None) -> SandboxHandle:
        return await Sandbox.spawn(spec, mode, session_limits)

    return spawn


class Sandbox:
    """One started sandbox. Not safe for concurrent runs: the pool and the session lock
    hand each sandbox to one run at a time."""

    def __init__(self, process: asyncio.subprocess.Process, sock: socket.socket, mode: str) -> None:
        self.cgroup: SandboxCgroup | None = None
        self.process = process
        self.sock = sock
        self.mode = mode
        self.runs = 0
        self.healthy = True
        self.created = time.monotonic()

    @classmethod
    async def spawn(
        cls, spec: SandboxSpec, mode: str, session_limits: dict[str, Any] | None = None
    ) -> Sandbox:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command(mode, theirs.fileno(), session_limits),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
                env=_BWRAP_ENV,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            raise SandboxStartError(f"cannot start {spec.bwrap}: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        sandbox = cls(process, ours, mode)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(spec.start_timeout_s):
                ready = await loop.sock_recv(ours, runner.MAX_MESSAGE_BYTES)
        except TimeoutError:
            ready = b""
        if not ready or json.loads(ready).get("op") != "ready":
            await sandbox.kill()
            why = b""
            if process.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    why = await asyncio.wait_for(process.stderr.read(4096), 1.0)
            raise SandboxStartError(
                f"sandbox did not start (bwrap exit {process.returncode}): "
                f"{why.decode(errors='replace').strip() or 'no message'}"
            )
        if spec.cgroup_root is not None:
            # Ready: bwrap and the runner exist and nothing else will run before the first
            # request, so every later process of the sandbox starts inside the cgroup.
            try:
                sandbox.cgroup = SandboxCgroup.create(
                    spec.cgroup_root, f"sandbox-{process.pid}", _tree(process.pid)
                )
            except OSError as exc:
                await sandbox.kill()
                raise SandboxStartError(f"cannot put the sandbox in a cgroup: {exc}") from exc
        return sandbox

    @property
    def alive(self) -> bool:
        return self.healthy and self.process.returncode is None

    async def run(self, request: ExecRequest, backstop_s: float) -> RawRun:
        """One run: pipes out via SCM_RIGHTS, payload and stdin in, output capped; the
        runner enforces the wall clock, `backstop_s` later the service kills everything."""
        self.runs += 1
        loop = asyncio.get_running_loop()
        payload_r, payload_w = os.pipe()
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        message = {
            "op": "run",
            "language": request.language.value,
            "timeout_s": request.limits.timeout_s,
            "limits": request.limits.for_runner(),
        }
        payload = json.dumps(
            {
                "code": request.code,
                "files": [
                    {
                        "path": f.path,
                        "content": base64.b64encode(f.content).decode(),
                        "executable": f.executable,
                    }
                    for f in request.files
                ],
            }
        ).encode()
        start = time.monotonic()
        oom_before = cpu_before = 0.0
        if self.cgroup is not None:
            try:
                self.cgroup.limit(request.limits.memory_bytes, request.limits.max_processes)
                oom_before, cpu_before = self.cgroup.oom_kills(), self.cgroup.cpu_s()
            except OSError:
                logger.exception("cannot set the limits of cgroup %s", self.cgroup.path)
                self.healthy = False
                for fd in (payload_r, payload_w, stdin_r, stdin_w, out_r, out_w, err_r, err_w):
                    os.close(fd)
                return RawRun(None, b"", b"", False, False, False, 0.0)
        try:
            socket.send_fds(
                self.sock, [json.dumps(message).encode()], [payload_r, stdin_r, out_w, err_w]
            )
        except OSError:
            for fd in (payload_r, payload_w, stdin_r, stdin_w, out_r, out_w, err_r, err_w):
                os.close(fd)
            self.healthy = False
            return RawRun(None, b"", b"", False, False, False, 0.0)
        finally:
            if self.healthy:
                for fd in (payload_r, stdin_r, out_w, err_w):
                    os.close(fd)
        overflow = asyncio.Event()
        cap = request.limits.max_output_bytes
        readers = (CappedReader(out_r, cap, overflow.set), CappedReader(err_r, cap, overflow.set))
        feeders = [
            asyncio.create_task(feed(payload_w, payload)),
            asyncio.create_task(feed(stdin_w, request.stdin)),
        ]
        report_task = asyncio.create_task(loop.sock_recv(self.sock, runner.MAX_MESSAGE_BYTES))
        overflow_task = asyncio.create_task(overflow.wait())
        backstop_killed = False
        try:
            await asyncio.wait(
                {report_task, overflow_task},
                timeout=request.limits.timeout_s + backstop_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if overflow.is_set() and not report_task.done():
                self._stop_after_overflow(readers)
                await asyncio.wait({report_task}, timeout=backstop_s)
            if not report_task.done():
                backstop_killed = True
                await self.kill()
            report = self._parse_report(report_task)
            await asyncio.wait([r.eof for r in readers], timeout=_EOF_GRACE_S)
        except asyncio.CancelledError:
            # The caller gave up (deadline): the program may still run, so this sandbox
            # must not serve anyone else; the pool replaces it.
            self.healthy = False
            raise
        finally:
            for task in (report_task, overflow_task, *feeders):
                task.cancel()
            for reader in readers:
                reader.close()
            await asyncio.gather(*feeders, return_exceptions=True)
        if report is None or not report.get("reusable", False):
            self.healthy = False
        raw = RawRun(
            report,
            readers[0].data,
            readers[1].data,
            readers[0].overflowed,
            readers[1].overflowed,
            backstop_killed,
            time.monotonic() - start,
        )
        if self.cgroup is not None:
            raw.cgroup_oom_kills = self.cgroup.oom_kills() - int(oom_before)
            raw.cgroup_cpu_s = self.cgroup.cpu_s() - cpu_before
        return raw

    def _stop_after_overflow(self, readers: tuple[CappedReader, CappedReader]) -> None:
        if self.mode == "oneshot":
            with contextlib.suppress(OSError):
                self.sock.send(json.dumps({"op": "kill"}).encode())
        else:
            # The cell runs in the session's runner: a write to a closed pipe raises
            # BrokenPipeError in the cell, which ends it and keeps the session's state.
            for reader in readers:
                reader.close()

    def _parse_report(self, task: asyncio.Task[bytes]) -> dict[str, Any] | None:
        if not task.done() or task.cancelled() or task.exception() is not None:
            self.healthy = False
            return None
        raw = task.result()
        try:
            report = json.loads(raw) if raw else None
        except ValueError:
            report = None
        if not isinstance(report, dict) or report.get("op") != "done":
            self.healthy = False
            return None
        return report

    async def kill(self) -> None:
        """Kill the sandbox and everything in it, then reap bwrap. The PID namespace's
        init (the runner) is killed first: the kernel then kills every process of the
        namespace, and bwrap, still alive, reaps it (killing bwrap first would leave the
        init as a zombie for the host's init to reap)."""
        self.healthy = False
        pid = self.process.pid
        if self.process.returncode is None:
            for child in _children(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            try:
                await asyncio.wait_for(self.process.wait(), 1.0)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                await self.process.wait()
        self.sock.close()
        if self.cgroup is not None:
            cgroup, self.cgroup = self.cgroup, None
            await asyncio.to_thread(cgroup.remove)


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(_children(current))
    return found


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []
