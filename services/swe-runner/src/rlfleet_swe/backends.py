"""Container backends: each runs one command in a fresh container of an instance's image,
with stdin, a memory/CPU/process cap and no network, and kills it at a deadline.

docker: `docker run --rm -i` with a unique name and the runner's labels, so the watchdog can
`docker kill` it by name and leftovers from a crash are found by label and removed.

Labels: `rlfleet.swe.runner=<eval.runner_label>` (a group name, the same for every runner of
a deployment), `rlfleet.swe.instance=<random id made at start>` and `rlfleet.swe.owner=
<host>/<boot id>/<pid>/<process start time>` (the runner process). At start a runner removes
only containers of its group whose owner is gone: same host and boot, and that pid is not
running or is another process (its start time differs). A container whose owner cannot be
checked from here (another host or container: its hostname differs) is removed once it is
older than `eval.foreign_reap_after_s` (past any deadline a live runner could still hold it
for); other containers of a live runner are left alone. At stop a runner removes every
container of its own instance. The `docker run`/`exec` clients get SIGKILL when the runner
dies (PR_SET_PDEATHSIG), so a crashed runner leaves no client processes behind.
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
import shutil
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from rlfleet_swe.config import EvalConfig

logger = logging.getLogger(__name__)
RUNNER_LABEL = "rlfleet.swe.runner"
INSTANCE_LABEL = "rlfleet.swe.instance"
OWNER_LABEL = "rlfleet.swe.owner"


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22); None
    when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def process_owner(pid: int | None = None) -> str:
    """This process as an owner label value: host/boot id/pid/start time."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}/{_boot_id()}/{pid}/{_start_time(pid)}"


def owner_checkable(owner: str) -> bool:
    """Whether `owner` is a process of this host and boot (so `owner_gone` can tell)."""
    parts = owner.split("/")
    return (
        len(parts) == 4
        and parts[2].isdigit()
        and parts[0] == socket.gethostname()
        and parts[1] == _boot_id()
    )


_SETPRIV = shutil.which("setpriv")


def die_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGKILL when the runner dies (util-linux `setpriv
    --pdeathsig`, which sets PR_SET_PDEATHSIG and execs it), so a crashed runner leaves
    no `docker run` client running. (A preexec_fn would force a plain fork of the
    service, which gRPC's threads do not survive.) Unchanged where setpriv is missing."""
    # A missing program stays an OSError at spawn (the callers report it as such).
    if not _SETPRIV or not argv or shutil.which(argv[0]) is None:
        return argv
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def owner_gone(owner: str) -> bool:
    """Whether the runner process `owner` names has surely ended. False when it cannot
    be told from here (another host, another boot, or a malformed value)."""
    parts = owner.split("/")
    if len(parts) != 4 or not parts[2].isdigit():
        return False
    host, boot, pid, started = parts
    if host != socket.gethostname() or boot != _boot_id():
        return False
    return _start_time(int(pid)) != started


@dataclass(frozen=True)
class RunnerIdentity:
    """Who this runner instance is, as the labels on its containers."""

    group: str
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    owner: str = field(default_factory=process_owner)

    def label_args(self) -> list[str]:
        return [
            "--label", f"{RUNNER_LABEL}={self.group}",
            "--label", f"{INSTANCE_LABEL}={self.instance}",
            "--label", f"{OWNER_LABEL}={self.owner}",
        ]  # fmt: skip


async def remove_labelled(docker: str, timeout: float, *filters: str,
                          keep: Callable[[str], bool] = lambda _: False,
                          age_out: Callable[[str], bool] = lambda _: False,
                          max_age_s: float = 0.0) -> int:  # fmt: skip
    """`docker rm -f` the containers matching every `label=` filter whose owner label
    `keep` does not accept, and those whose owner `age_out` accepts that were created
    more than `max_age_s` ago; returns how many."""
    args = [f"--filter=label={f}" for f in filters]
    fmt = '{{.ID}} {{.Label "' + OWNER_LABEL + '"}}'
    _, out = await run_cmd([docker, "ps", "-a", *args, "--format", fmt], timeout)
    ids, kept = [], []
    for line in out.decode().splitlines():
        cid, _, owner = line.partition(" ")
        if cid and not keep(owner):
            ids.append(cid)
        elif cid and age_out(owner):
            kept.append(cid)
    if kept:
        ids += await _created_before(docker, timeout, kept, time.time() - max_age_s)
    if ids:
        await run_cmd([docker, "rm", "-f", "-v", *ids], timeout)
    return len(ids)


async def _created_before(docker: str, timeout: float, ids: list[str], cutoff: float) -> list[str]:
    _, out = await run_cmd([docker, "inspect", "--format", "{{.Id}} {{.Created}}", *ids], timeout)
    old = []
    for line in out.decode().splitlines():
        cid, _, created = line.partition(" ")
        try:
            # RFC 3339 with nanoseconds: keep microseconds for fromisoformat.
            stamp = created.strip().replace("Z", "+00:00")
            head, _, rest = stamp.partition(".")
            if rest:
                digits = "".join(c for c in rest if c.isdigit())
                stamp = f"{head}.{digits[:6]}{rest[len(digits) :]}"
            when = datetime.fromisoformat(stamp).astimezone(UTC).timestamp()
        except ValueError:
            continue
        if when < cutoff:
            old.append(cid[:12])
    return old


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
    disk_written: int = 0
    """Bytes of the writable layer when the disk watchdog ended the call (0: it did not)."""


async def disk_over(docker: str, name: str, cap: int, interval: float, timeout: float) -> int:
    """Wait until container `name`'s writable layer is over `cap` bytes; its size then.
    A failed measurement (the container is starting or gone) is tried again."""
    argv = [docker, "container", "inspect", "--size", "--format", "{{.SizeRw}}", name]
    while True:
        await asyncio.sleep(interval)
        try:
            rc, out = await run_cmd(argv, timeout)
        except (TimeoutError, OSError):
            continue
        text = out.decode().strip()
        if rc == 0 and text.isdigit() and int(text) > cap:
            return int(text)


OnDeadline = Callable[[asyncio.subprocess.Process], Awaitable[None]]


async def run_cmd(argv: list[str], timeout: float, stdin: bytes = b"") -> tuple[int, bytes]:
    """Run a short host command (docker ps/kill/rm) with a deadline; (rc, stdout+stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *die_with_parent(argv),
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
            *die_with_parent(argv),
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

    async def remove_own(self) -> int: ...


class DockerBackend:
    def __init__(self, config: EvalConfig, identity: RunnerIdentity) -> None:
        self.config = config
        self.identity = identity

    def command(self, name: str, image: str, workdir: str, limits: Limits,
                argv: list[str]) -> list[str]:  # fmt: skip
        return [
            self.config.docker, "run", "--rm", "-i", "--pull", "never", "--name", name,
            *self.identity.label_args(), "--network", "none",
            "--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes),
            "--cpus", f"{limits.cpus:g}", "--pids-limit", str(limits.pids),
            "--ulimit", f"fsize={self.config.disk_bytes}",
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

        async def kill(proc: asyncio.subprocess.Process | None) -> None:
            del proc
            with contextlib.suppress(TimeoutError, OSError):
                await run_cmd([self.config.docker, "kill", name], self.config.docker_call_timeout_s)

        config = self.config
        running = asyncio.ensure_future(_run_with_watchdog(
            self.command(name, image, workdir, limits, argv), stdin, timeout, kill,
            config.max_output_bytes,
        ))  # fmt: skip
        disk = asyncio.ensure_future(disk_over(
            config.docker, name, config.disk_bytes, config.disk_check_interval_s,
            config.docker_call_timeout_s,
        ))  # fmt: skip
        try:
            await asyncio.wait({running, disk}, return_when=asyncio.FIRST_COMPLETED)
            if not disk.done():
                return running.result()
            await kill(None)
            result = await running
            result.disk_written = disk.result()
            return result
        finally:
            disk.cancel()
            if not running.done():
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
            # --rm removes it on a normal exit; this covers a killed or cancelled call.
            await asyncio.shield(self._remove(name))

    async def remove_stale(self) -> int:
        """Leftovers of this runner group whose runner process is gone (a crash), and those
        of a runner this host cannot check that are older than eval.foreign_reap_after_s."""
        return await remove_labelled(
            self.config.docker, self.config.docker_call_timeout_s,
            f"{RUNNER_LABEL}={self.identity.group}",
            keep=lambda owner: not (owner_checkable(owner) and owner_gone(owner)),
            age_out=lambda owner: not owner_checkable(owner),
            max_age_s=self.config.foreign_reap_after_s,
        )  # fmt: skip

    async def remove_own(self) -> int:
        """Every container of this runner instance (at stop)."""
        return await remove_labelled(
            self.config.docker, self.config.docker_call_timeout_s,
            f"{INSTANCE_LABEL}={self.identity.instance}",
        )  # fmt: skip


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

    async def remove_own(self) -> int:
        return 0


def make_backend(config: EvalConfig, identity: RunnerIdentity) -> Backend:
    if config.backend == "docker":
        return DockerBackend(config, identity)
    return ApptainerBackend(config)
