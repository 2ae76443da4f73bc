"""Container backends: each runs one command in a fresh container of an instance's image,
with stdin, a memory/CPU/process cap and no network, and kills it at a deadline.

docker: `docker run --rm -i` with a unique name and the runner's label, so the watchdog can
`docker kill` it by name and leftovers from a crash are found by label and removed.
apptainer: `apptainer exec --containall --writable-tmpfs` over a `.sif` path with
Apptainer's cgroup flags; the container is the process tree of that command, so the
watchdog ends it by killing the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from rlfleet_swe.config import EvalConfig

logger = logging.getLogger(__name__)
RUNNER_LABEL = "rlfleet.swe.runner"


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpus: float
    pids: int


@dataclass
class RunResult:
    returncode: int | None
    """None when the watchdog killed the container."""
    output: bytes
    timed_out: bool


OnDeadline = Callable[[asyncio.subprocess.Process], Awaitable[None]]


async def run_cmd(argv: list[str], timeout: float, stdin: bytes = b"") -> tuple[int, bytes]:
    """Run a short host command (docker ps/kill/rm) with a deadline; (rc, stdout+stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    return proc.returncode or 0, out


async def _run_with_watchdog(
    argv: list[str], stdin: bytes, timeout: float, on_deadline: OnDeadline, max_output: int
) -> RunResult:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as error:  # the container CLI is missing: an infra error, not a crash
        return RunResult(127, f"cannot run {argv[0]}: {error}".encode(), timed_out=False)
    tail = bytearray()

    async def talk() -> None:
        assert proc.stdin and proc.stdout
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()
        # Only the end is kept (pytest's summary is there): a test printing without end
        # must not fill the service's memory.
        while chunk := await proc.stdout.read(1 << 16):
            tail.extend(chunk)
            del tail[: max(0, len(tail) - max_output)]
        await proc.wait()

    try:
        await asyncio.wait_for(talk(), timeout)
        return RunResult(proc.returncode, bytes(tail), timed_out=False)
    except TimeoutError:
        await on_deadline(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return RunResult(None, bytes(tail), timed_out=True)
    finally:
        if proc.returncode is None:  # cancelled (client gone): still end it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


class Backend(Protocol):
    def command(self, name: str, image: str, workdir: str, limits: Limits,
                argv: list[str]) -> list[str]: ...  # fmt: skip

    async def run(self, image: str, workdir: str, limits: Limits, argv: list[str],
                  stdin: bytes, timeout: float) -> RunResult: ...  # fmt: skip

    async def remove_stale(self) -> int: ...


class DockerBackend:
    def __init__(self, config: EvalConfig) -> None:
        self.config = config

    def command(self, name: str, image: str, workdir: str, limits: Limits,
                argv: list[str]) -> list[str]:  # fmt: skip
        return [
            self.config.docker, "run", "--rm", "-i", "--pull", "never", "--name", name,
            "--label", f"{RUNNER_LABEL}={self.config.runner_label}",
            "--network", "none",
            "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
            "--cpus", f"{limits.cpus:g}", "--pids-limit", str(limits.pids),
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--workdir", workdir, image, *argv,
        ]  # fmt: skip

    async def _remove(self, name: str) -> None:
        """Remove the container and wait until it is gone: `docker run --rm` may be removing
        it at the same time, and then `docker rm -f` returns before the removal is done."""
        docker, timeout = self.config.docker, self.config.docker_call_timeout_s
        deadline = time.monotonic() + timeout
        try:
            await run_cmd([docker, "rm", "-f", name], timeout)
            while time.monotonic() < deadline:
                rc, _ = await run_cmd([docker, "container", "inspect", name], timeout)
                if rc != 0:
                    return
                await asyncio.sleep(0.1)
        except (TimeoutError, OSError):
            pass
        logger.warning("container %s not removed in time; the next start removes it", name)

    async def run(self, image: str, workdir: str, limits: Limits, argv: list[str],
                  stdin: bytes, timeout: float) -> RunResult:  # fmt: skip
        name = f"rlfleet-swe-{secrets.token_hex(8)}"

        async def kill(proc: asyncio.subprocess.Process) -> None:
            del proc
            with contextlib.suppress(TimeoutError, OSError):
                await run_cmd([self.config.docker, "kill", name], self.config.docker_call_timeout_s)

        try:
            return await _run_with_watchdog(
                self.command(name, image, workdir, limits, argv),
                stdin,
                timeout,
                kill,
                self.config.max_output_bytes,
            )
        finally:
            # --rm removes it on a normal exit; this covers a killed or cancelled call.
            await asyncio.shield(self._remove(name))

    async def remove_stale(self) -> int:
        label = f"label={RUNNER_LABEL}={self.config.runner_label}"
        _, out = await run_cmd(
            [self.config.docker, "ps", "-aq", "--filter", label], self.config.docker_call_timeout_s
        )
        ids = out.decode().split()
        if ids:
            await run_cmd([self.config.docker, "rm", "-f", *ids], self.config.docker_call_timeout_s)
        return len(ids)


class ApptainerBackend:
    def __init__(self, config: EvalConfig) -> None:
        self.config = config

    def command(self, name: str, image: str, workdir: str, limits: Limits,
                argv: list[str]) -> list[str]:  # fmt: skip
        del name  # an exec'd container has no name: the watchdog kills its process group
        return [
            self.config.apptainer, "exec", "--containall", "--writable-tmpfs", "--cleanenv",
            "--net", "--network", "none",
            "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
            "--cpus", f"{limits.cpus:g}", "--pids-limit", str(limits.pids),
            "--pwd", workdir, image, *argv,
        ]  # fmt: skip

    async def run(self, image: str, workdir: str, limits: Limits, argv: list[str],
                  stdin: bytes, timeout: float) -> RunResult:  # fmt: skip
        async def stop(proc: asyncio.subprocess.Process) -> None:
            # SIGTERM first so apptainer tears its container down, then the group is killed.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), self.config.kill_grace_s)

        return await _run_with_watchdog(
            self.command("", image, workdir, limits, argv),
            stdin,
            timeout,
            stop,
            self.config.max_output_bytes,
        )

    async def remove_stale(self) -> int:
        return 0


def make_backend(config: EvalConfig) -> Backend:
    return DockerBackend(config) if config.backend == "docker" else ApptainerBackend(config)
