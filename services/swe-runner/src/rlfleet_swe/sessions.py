"""Agent mode: a session is a running container of an instance's image (a docker container
or an apptainer instance), where the policy's tools run: bash (with a per-command time
limit), view, edit, submit.
At submit the patch is `git diff` of the work tree against base_commit; the caller scores
it with `Evaluate` (a fresh container), so nothing the agent left behind is scored.

Sessions are owned as the sandbox service's are: the caller sends a secret key
(`x-rlfleet-client-key` metadata), the owner is a hash of it, and sessions are looked up by
(owner, session id): another key's session is NOT_FOUND. At most `max_sessions` are open;
one more is RESOURCE_EXHAUSTED. Calls on one session run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import re
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field

from rlfleet_core.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from rlfleet_proto.v1 import swe_pb2

from rlfleet_swe.backends import RunnerIdentity, disk_over, run_cmd
from rlfleet_swe.config import EvalConfig, SessionsConfig

logger = logging.getLogger(__name__)
CLIENT_KEY_HEADER = "x-rlfleet-client-key"
_CLIENT_KEY = re.compile(r"^[\x21-\x7e]{16,256}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,511}$")
_SIF = re.compile(r"^/[^\x00-\x1f]{1,4095}$")
_COMMIT = re.compile(r"^([0-9a-f]{7,64})?$")
# Runs inside the container: str_replace of exactly one occurrence, or a whole-file write.
_EDIT = r"""
import json, os, sys
req = json.load(sys.stdin)
path, old, new = req["path"], req["old"], req["new"]
if old == "":
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(new)
    print("wrote %s (%d lines)" % (path, new.count("\n"))); sys.exit(0)
try:
    text = open(path).read()
except OSError as e:
    print("cannot read %s: %s" % (path, e.strerror)); sys.exit(2)
count = text.count(old)
if count != 1:
    print("old_str occurs %d times in %s; it must occur exactly once" % (count, path)); sys.exit(2)
with open(path, "w") as f:
    f.write(text.replace(old, new))
print("edited %s" % path)
"""


# Each tool call runs under this, inside the container: the call under `timeout`, then
# every other process of the container but its PID 1 is killed (kill -1 spares the caller
# and PID 1), so nothing the call backgrounded, setsid'ed or forked outlives it. Only
# builtins after the call: a fork bomb may have taken every pid of the cap.
_RUN = r"""t=$1; shift
timeout -s KILL "$t" "$@"
rc=$?
n=0
while kill -9 -1 2>/dev/null && [ "$n" -lt 100000 ]; do n=$((n + 1)); done
exit $rc"""


# PID 1 of a docker session: it only reaps. Processes killed after a call are re-parented
# to PID 1; `sleep infinity` there never reaped them, and their zombies kept the pids cap
# full (a killed fork bomb left the session unable to fork).
_REAPER = r"""
import os, signal
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
while True:
    signal.pause()
"""


def exclude_pathspecs(patterns: list[str]) -> list[str]:
    """git pathspecs that leave `patterns` (file or folder names, globs) out, anywhere."""
    return [
        f":(exclude,glob){where}"
        for pattern in patterns
        for where in (f"**/{pattern}", f"**/{pattern}/**")
    ]


def owner_of(client_key: str | None) -> str:
    """The owner a client key stands for: a hash, so the key is never kept or logged."""
    if not client_key:
        raise InvalidArgument(CLIENT_KEY_HEADER, "is required for sessions: send a random "
                              "secret of 16-256 characters on every call")  # fmt: skip
    if not _CLIENT_KEY.match(client_key):
        raise InvalidArgument(CLIENT_KEY_HEADER, "use 16-256 printable ASCII characters")
    return "k" + hashlib.sha256(client_key.encode()).hexdigest()[:32]


class DiskFull(Exception):
    """A session's container wrote more than eval.disk_bytes."""

    def __init__(self, written: int) -> None:
        super().__init__(written)
        self.written = written


@dataclass
class Session:
    owner: str
    session_id: str
    container: str
    workdir: str
    base_commit: str
    idle_timeout_s: float
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionManager:
    def __init__(
        self, eval_config: EvalConfig, config: SessionsConfig, identity: RunnerIdentity
    ) -> None:
        self.eval = eval_config
        self.config = config
        self.identity = identity
        self._sessions: dict[tuple[str, str], Session] = {}
        self._opening = 0
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle())

    async def stop(self) -> None:
        if self._reaper:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for key in list(self._sessions):
            await self._close(self._sessions.pop(key))

    async def open(self, owner: str, request: swe_pb2.SweOpenSessionRequest) -> Session:
        if self.eval.backend == "apptainer":
            if not _SIF.match(request.image):
                raise InvalidArgument("image", f"the apptainer backend needs an absolute .sif "
                                      f"path, got {request.image[:80]!r}")  # fmt: skip
        elif not _IMAGE.match(request.image):
            raise InvalidArgument(
                "image", f"must be a docker image name, got {request.image[:80]!r}"
            )
        if not request.workdir.startswith("/") or "\x00" in request.workdir:
            raise InvalidArgument("workdir", f"must be an absolute path, got {request.workdir!r}")
        if not _COMMIT.match(request.base_commit):
            raise InvalidArgument("base_commit", "must be a hex commit id or empty")
        idle = request.idle_timeout_s
        if not math.isfinite(idle) or idle < 0:
            raise InvalidArgument("idle_timeout_s", f"must be >= 0 (0 = default), got {idle}")
        idle = min(idle or self.config.idle_timeout_s, self.config.max_idle_timeout_s)
        memory = request.memory_bytes or self.eval.memory_bytes
        if memory < 64 << 20 or memory > self.eval.max_memory_bytes:
            raise InvalidArgument("memory_bytes", f"must be 0 or in [64 MiB, "
                                  f"{self.eval.max_memory_bytes}], got {memory}")  # fmt: skip
        if len(self._sessions) + self._opening >= self.config.max_sessions:
            raise ResourceExhausted(f"{self.config.max_sessions} SWE sessions are open "
                                    "(sessions.max_sessions); close one or retry later")  # fmt: skip
        if (
            sum(1 for key in self._sessions if key[0] == owner)
            >= self.config.max_sessions_per_client
        ):
            raise ResourceExhausted(f"this client has {self.config.max_sessions_per_client} SWE "
                                    "sessions open (sessions.max_sessions_per_client)")  # fmt: skip
        self._opening += 1
        try:
            name = f"rlfleet-swe-s-{secrets.token_hex(8)}"
            rc, out = await self._docker(
                self._start_argv(name, request.image, request.workdir, memory),
                self.eval.docker_call_timeout_s,
            )
            if rc != 0:
                with contextlib.suppress(TimeoutError):
                    await run_cmd(self._stop_argv(name), self.eval.docker_call_timeout_s)
                raise InvalidArgument("image", f"container did not start: {out.decode()[-500:]}")
            session = Session(owner, secrets.token_hex(16), name, request.workdir,
                              request.base_commit or "HEAD", idle)  # fmt: skip
            self._sessions[(owner, session.session_id)] = session
            return session
        finally:
            self._opening -= 1

    def _start_argv(self, name: str, image: str, workdir: str, memory: int) -> list[str]:
        """The command that starts a session's container, kept running until stopped.
        apptainer: a named instance (`apptainer instance start`) with the flags Evaluate's
        `apptainer exec` uses."""
        caps = ["--memory", str(memory), "--memory-swap", str(memory),
                "--cpus", f"{self.eval.cpus:g}", "--pids-limit", str(self.eval.pids_limit)]  # fmt: skip
        if self.eval.backend == "apptainer":
            return [self.eval.apptainer, "instance", "start", "--containall", "--writable-tmpfs",
                    "--cleanenv", "--net", "--network", "none", *caps, image, name]  # fmt: skip
        return [
            self.eval.docker, "run", "-d", "--rm", "--pull", "never", "--name", name,
            *self.identity.label_args(), "--network", "none", *caps,
            "--ulimit", f"fsize={self.eval.disk_bytes}",
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--workdir", workdir, "--entrypoint", "python3", image, "-c", _REAPER,
        ]  # fmt: skip

    def _exec_prefix(self, session: Session) -> list[str]:
        if self.eval.backend == "apptainer":
            return [self.eval.apptainer, "exec", "--pwd", session.workdir,
                    f"instance://{session.container}"]  # fmt: skip
        return [self.eval.docker, "exec", "-i", "--workdir", session.workdir, session.container]

    def _stop_argv(self, name: str) -> list[str]:
        if self.eval.backend == "apptainer":
            return [self.eval.apptainer, "instance", "stop", name]
        return [self.eval.docker, "rm", "-f", name]

    async def _docker(self, argv: list[str], timeout: float) -> tuple[int, bytes]:
        try:
            return await run_cmd(argv, timeout)
        except OSError as error:
            raise Unavailable(
                f"cannot run {argv[0]} (eval.{self.eval.backend}): {error}"
            ) from error
        except TimeoutError as error:
            raise Unavailable(f"{argv[0]} {argv[1]} did not answer in {timeout:g} s") from error

    def get(self, owner: str, session_id: str) -> Session:
        session = self._sessions.get((owner, session_id))
        if session is None:
            raise NotFound(f"session_id: no open session {session_id[:64]!r} of this client")
        return session

    async def close(self, owner: str, session_id: str) -> None:
        session = self.get(owner, session_id)
        self._sessions.pop((owner, session_id), None)
        async with session.lock:
            await self._close(session)

    async def _close(self, session: Session) -> None:
        with contextlib.suppress(TimeoutError, OSError):
            await run_cmd(self._stop_argv(session.container), self.eval.docker_call_timeout_s)

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(self.config.reap_interval_s)
            now = time.monotonic()
            for key, session in list(self._sessions.items()):
                if not session.lock.locked() and now - session.last_used > session.idle_timeout_s:
                    self._sessions.pop(key, None)
                    logger.info("closing idle SWE session %s", session.session_id)
                    await self._close(session)

    async def _exec(self, session: Session, argv: list[str], stdin: bytes, timeout: float,
                    keep: int | None = None) -> tuple[int, str, bool]:  # fmt: skip
        """Run argv in the session's container; the command is killed inside the container
        at `timeout` (coreutils timeout), and the docker call has a deadline past that.
        docker: the disk watchdog (eval.disk_bytes) runs beside it; over the cap the
        container is removed and DiskFull raised."""
        command = [*self._exec_prefix(session), "bash", "-c", _RUN, "run", f"{timeout:g}", *argv]
        call = run_cmd(command, timeout + self.eval.docker_call_timeout_s, stdin)
        try:
            if self.eval.backend == "docker":
                rc, out = await self._watching_disk(session, call)
            else:
                rc, out = await call
        except TimeoutError:
            return -1, "", True
        text = out.decode(errors="replace")[-(keep or self.config.max_output_bytes) :]
        return rc, text, rc in (124, 137)

    async def _watching_disk(
        self, session: Session, call: Coroutine[object, object, tuple[int, bytes]]
    ) -> tuple[int, bytes]:
        running = asyncio.ensure_future(call)
        disk = asyncio.ensure_future(disk_over(
            self.eval.docker, session.container, self.eval.disk_bytes,
            self.eval.disk_check_interval_s, self.eval.docker_call_timeout_s,
        ))  # fmt: skip
        try:
            await asyncio.wait({running, disk}, return_when=asyncio.FIRST_COMPLETED)
            if not disk.done():
                return running.result()
            # Removing the container ends the command and frees what it wrote.
            await self._close(session)
            raise DiskFull(disk.result())
        finally:
            disk.cancel()
            if not running.done():
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await running

    async def run_tool(
        self, owner: str, request: swe_pb2.SweRunToolRequest
    ) -> swe_pb2.SweRunToolReply:
        session = self.get(owner, request.session_id)
        timeout = request.timeout_s
        if not math.isfinite(timeout) or timeout < 0 or timeout > self.config.max_command_timeout_s:
            raise InvalidArgument("timeout_s", f"must be in [0, {self.config.max_command_timeout_s}]"
                                  f" (0 = sessions.command_timeout_s), got {timeout}")  # fmt: skip
        timeout = timeout or self.config.command_timeout_s
        tool = request.tool
        if tool == swe_pb2.SWE_TOOL_BASH and not request.command.strip():
            raise InvalidArgument("command", "is required for SWE_TOOL_BASH")
        if tool in (swe_pb2.SWE_TOOL_VIEW, swe_pb2.SWE_TOOL_EDIT) and not request.path:
            raise InvalidArgument("path", "is required for view and edit")
        if tool not in swe_pb2.SweTool.values() or tool == swe_pb2.SWE_TOOL_UNSPECIFIED:
            raise InvalidArgument("tool", "choose SWE_TOOL_BASH, _VIEW, _EDIT or _SUBMIT")
        async with session.lock:
            session.last_used = time.monotonic()
            try:
                return await self._run_tool(session, request, timeout)
            except DiskFull as full:
                self._sessions.pop((owner, session.session_id), None)
                return swe_pb2.SweRunToolReply(
                    output=f"the session's container wrote {full.written} bytes, over "
                    f"eval.disk_bytes={self.eval.disk_bytes}: the command was stopped and "
                    "the session closed",
                    exit_code=-1,
                    error=True,
                )
            finally:
                session.last_used = time.monotonic()

    async def _run_tool(self, session: Session, request: swe_pb2.SweRunToolRequest,
                        timeout: float) -> swe_pb2.SweRunToolReply:  # fmt: skip
        if request.tool == swe_pb2.SWE_TOOL_BASH:
            rc, out, timed_out = await self._exec(
                session, ["bash", "-c", request.command], b"", timeout
            )
            return swe_pb2.SweRunToolReply(output=out, exit_code=rc, timed_out=timed_out)
        if request.tool == swe_pb2.SWE_TOOL_VIEW:
            script = 'if [ -d "$1" ]; then ls -la -- "$1"; else cat -n -- "$1"; fi'
            rc, out, timed_out = await self._exec(
                session, ["bash", "-c", script, "view", request.path], b"", timeout
            )
            return swe_pb2.SweRunToolReply(
                output=out, exit_code=rc, timed_out=timed_out, error=rc != 0
            )
        if request.tool == swe_pb2.SWE_TOOL_EDIT:
            payload = json.dumps(
                {"path": request.path, "old": request.old_str, "new": request.new_str}
            )
            rc, out, timed_out = await self._exec(
                session, ["python3", "-c", _EDIT], payload.encode(), timeout
            )
            return swe_pb2.SweRunToolReply(
                output=out, exit_code=rc, timed_out=timed_out, error=rc != 0
            )
        # Submit: the work tree's changes, new files included, against base_commit; build
        # junk (sessions.submit_exclude) is left out by pathspec, so the repository's own
        # .gitignore is not touched.
        script = 'git add -A >/dev/null && git diff --cached --no-color --no-ext-diff "$@"'
        excluded = exclude_pathspecs(self.config.submit_exclude)
        rc, out, timed_out = await self._exec(
            session,
            ["bash", "-c", script, "submit", session.base_commit, "--", ".", *excluded],
            b"",
            timeout,
            keep=self.eval.max_patch_bytes + 1,
        )
        if rc == 0 and len(out.encode()) > self.eval.max_patch_bytes:
            out, rc = f"the patch is over eval.max_patch_bytes={self.eval.max_patch_bytes}", 1
        if rc != 0:
            return swe_pb2.SweRunToolReply(
                output=out, exit_code=rc, timed_out=timed_out, error=True
            )
        return swe_pb2.SweRunToolReply(output="submitted", patch=out)
