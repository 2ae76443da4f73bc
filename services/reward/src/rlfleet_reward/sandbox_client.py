"""The `code` environment's view of the sandbox service: one method, behind a Protocol.

`GrpcSandboxClient` calls rlfleet.v1.SandboxService.Execute with a deadline on every call
(the program's own time limit plus a fixed allowance for start-up and transfer), so a
wedged sandbox costs one bounded wait, never a hung reward call (NeMo-RL PR #3666).
Transport failures become `SandboxUnavailable`, which the environment reports as a
SANDBOX_ERROR failure rather than as a wrong program.

Stateful sessions (the `math_with_code` tool, python_tool.py; `math_python` episodes)
each belong to a sandbox client key of their own, HMAC(this client's secret, a random
label), sent as `x-rlfleet-client-key` metadata. The handle `create_session` returns is
"<label>.<sandbox session id>": every later call derives that session's key from it, so
nothing is stored per session, and a handle is useless without this client's secret
(random per client unless one is given). One key per session means the sandbox's
per-client quota (`sessions.max_sessions_per_client`) never caps the gateway as a whole:
the gateway's episodes are many clients to the sandbox, bounded together by the
sandbox's `sessions.max_sessions` (a refusal is SandboxBusy) and by the gateway's own caps.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc import aio
from rlfleet_core.client import RetryPolicy, connect
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc


class ExecStatus(enum.Enum):
    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    OUTPUT_LIMIT = "output_limit"
    SANDBOX_ERROR = "sandbox_error"


_FROM_PROTO = {
    sandbox_pb2.EXEC_STATUS_OK: ExecStatus.OK,
    sandbox_pb2.EXEC_STATUS_ERROR: ExecStatus.ERROR,
    sandbox_pb2.EXEC_STATUS_TIMEOUT: ExecStatus.TIMEOUT,
    sandbox_pb2.EXEC_STATUS_MEMORY: ExecStatus.MEMORY,
    sandbox_pb2.EXEC_STATUS_OUTPUT_LIMIT: ExecStatus.OUTPUT_LIMIT,
    sandbox_pb2.EXEC_STATUS_SANDBOX_ERROR: ExecStatus.SANDBOX_ERROR,
}


@dataclass(frozen=True)
class ExecOutcome:
    status: ExecStatus
    stdout: str
    stderr: str
    exit_code: int
    wall_time_s: float


class SandboxUnavailable(RuntimeError):
    """The sandbox could not run the program (unreachable, deadline, internal error)."""


class SessionGone(SandboxUnavailable):
    """The session does not exist any more (closed, or expired after its idle timeout)."""


class SandboxBusy(SandboxUnavailable):
    """The sandbox refused a new session: its session limits are reached (retry later)."""


CLIENT_KEY_METADATA = "x-rlfleet-client-key"
_LABEL = re.compile(r"^[0-9a-f]{32}$")


class SandboxClient(Protocol):
    async def execute(self, code: str, *, stdin: str = "", timeout_s: float) -> ExecOutcome:
        """Run a Python program; `timeout_s` is its wall-clock limit."""

    async def close(self) -> None: ...


class GrpcSandboxClient:
    """SandboxClient over gRPC (rlfleet.v1.SandboxService)."""

    def __init__(
        self,
        target: str,
        *,
        call_overhead_s: float = 5.0,
        memory_bytes: int = 1 << 30,
        max_output_bytes: int = 1 << 20,
        client_key: str | None = None,
    ) -> None:
        self.target = target
        self._secret = (client_key or secrets.token_urlsafe(32)).encode()
        self._metadata = self._key_metadata("")
        self.call_overhead_s = call_overhead_s
        self.memory_bytes = memory_bytes
        self.max_output_bytes = max_output_bytes
        self._channel: aio.Channel = connect(
            target, default_timeout_s=30.0, retry=RetryPolicy(max_attempts=3)
        )
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    def _key_metadata(self, label: str) -> tuple[tuple[str, str], ...]:
        """Metadata carrying the client key of session `label` ("" = sessionless calls)."""
        digest = hmac.new(self._secret, f"session:{label}".encode(), hashlib.sha256).digest()
        return ((CLIENT_KEY_METADATA, base64.urlsafe_b64encode(digest).decode().rstrip("=")),)

    def _open_handle(self, handle: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        """(sandbox session id, metadata) of a handle made by `create_session`."""
        label, dot, session_id = handle.partition(".")
        if not dot or not _LABEL.match(label) or not session_id:
            raise SessionGone(f"sandbox session {handle[:80]!r} is not one this client opened")
        return session_id, self._key_metadata(label)

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float,
        session_id: str = "",
        files: Sequence[tuple[str, bytes, bool]] = (),
    ) -> ExecOutcome:
        """Run `code` (inside session `session_id`, a `create_session` handle, when given:
        SessionGone if it is gone), with `files` (path, content, executable) written into
        its work dir first."""
        metadata = self._metadata
        handle = session_id
        if handle:
            session_id, metadata = self._open_handle(handle)
        request = sandbox_pb2.ExecuteRequest(
            language=sandbox_pb2.LANGUAGE_PYTHON,
            code=code,
            stdin=stdin,
            files=[sandbox_pb2.File(path=p, content=c, executable=x) for p, c, x in files],
            limits=sandbox_pb2.Limits(
                timeout_s=timeout_s,
                memory_bytes=self.memory_bytes,
                max_output_bytes=self.max_output_bytes,
            ),
            session_id=session_id,
        )
        try:
            reply = await self._stub.Execute(
                request, timeout=timeout_s + self.call_overhead_s, metadata=metadata
            )
        except aio.AioRpcError as exc:
            if handle and exc.code() is grpc.StatusCode.NOT_FOUND:
                raise SessionGone(f"sandbox session {handle} is gone: {exc.details()}") from None
            raise SandboxUnavailable(
                f"sandbox {self.target} Execute failed: {exc.code().name}: {exc.details()}"
            ) from None
        status = _FROM_PROTO.get(reply.status, ExecStatus.SANDBOX_ERROR)
        return ExecOutcome(status, reply.stdout, reply.stderr, reply.exit_code, reply.wall_time_s)

    async def create_session(self, *, idle_timeout_s: float, timeout_s: float) -> str:
        """Open a stateful Python session under a client key of its own; its handle
        (pass it as `session_id`). `timeout_s` is the limit of each call in it;
        SandboxBusy when the sandbox's session limits are reached."""
        label = secrets.token_hex(16)
        request = sandbox_pb2.CreateSessionRequest(
            limits=sandbox_pb2.Limits(
                timeout_s=timeout_s,
                memory_bytes=self.memory_bytes,
                max_output_bytes=self.max_output_bytes,
            ),
            idle_timeout_s=idle_timeout_s,
        )
        try:
            # Starting a session starts its sandbox: allow for it like for a program start.
            reply = await self._stub.CreateSession(
                request,
                timeout=self.call_overhead_s + timeout_s,
                metadata=self._key_metadata(label),
            )
        except aio.AioRpcError as exc:
            kind = SandboxBusy if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED else None
            raise (kind or SandboxUnavailable)(
                f"sandbox {self.target} CreateSession failed: {exc.code().name}: {exc.details()}"
            ) from None
        return f"{label}.{reply.session_id}"

    async def close_session(self, session_id: str) -> bool:
        """Close session `session_id` (a `create_session` handle); whether it still existed."""
        try:
            sandbox_id, metadata = self._open_handle(session_id)
        except SessionGone:
            return False
        try:
            reply = await self._stub.CloseSession(
                sandbox_pb2.CloseSessionRequest(session_id=sandbox_id),
                timeout=self.call_overhead_s,
                metadata=metadata,
            )
        except aio.AioRpcError as exc:
            raise SandboxUnavailable(
                f"sandbox {self.target} CloseSession failed: {exc.code().name}: {exc.details()}"
            ) from None
        return bool(reply.existed)

    async def close(self) -> None:
        await self._channel.close()
