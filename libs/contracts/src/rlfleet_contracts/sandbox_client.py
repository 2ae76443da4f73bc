"""The rlfleet.v1.SandboxService contract on the caller's side: `SandboxClient` runs
programs (Execute) and stateful sessions, and returns typed outcomes or raises.

Every call has a deadline (the program's own time limit plus a fixed allowance for
start-up and transfer), so a wedged sandbox costs one bounded wait, never a hung reward
call (NeMo-RL PR #3666). Failures go through `rlfleet_core.calls`'s one classification:
`SandboxBusy` when the sandbox refuses a new session for its limits, `SessionGone` when a
named session no longer exists, `SandboxUnavailable` (their base) for everything else. The
reward gateway reports these as a SANDBOX_ERROR failure rather than as a wrong program.

Stateful sessions (the `math_with_code` tool, `math_python` episodes) each belong to a
sandbox client key of their own, HMAC(this client's secret, a random label), sent as
`x-rlfleet-client-key` metadata. The handle `create_session` returns is
"<label>.<sandbox session id>": every later call derives that session's key from it, so
nothing is stored per session, and a handle is useless without this client's secret
(random per client unless one is given). One key per session means the sandbox's
per-client quota (`sessions.max_sessions_per_client`) never caps a caller as a whole: its
sessions are many clients to the sandbox, bounded together by the sandbox's
`sessions.max_sessions` (a refusal is SandboxBusy) and by the caller's own caps.
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

from grpc import aio
from rlfleet_core.auth import CLIENT_KEY_HEADER
from rlfleet_core.calls import CallFailed, Endpoint, Failure, RpcFailure
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


class SandboxUnavailable(CallFailed):
    """The sandbox could not run the program (unreachable, deadline, internal error)."""


class SessionGone(SandboxUnavailable):
    """The session does not exist any more (closed, or expired after its idle timeout)."""


class SandboxBusy(SandboxUnavailable):
    """The sandbox refused a new session: its session limits are reached (retry later)."""


CLIENT_KEY_METADATA = CLIENT_KEY_HEADER
_LABEL = re.compile(r"^[0-9a-f]{32}$")


def new_client_key() -> str:
    """A fresh random client key (256 bits)."""
    return secrets.token_urlsafe(32)


def _unavailable(rpc: RpcFailure) -> SandboxUnavailable:
    return SandboxUnavailable(rpc.message, transient=rpc.transient, rpc=rpc)


class SandboxClient:
    """rlfleet.v1.SandboxService over gRPC, as one client (one secret)."""

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
        self._secret = (client_key or new_client_key()).encode()
        self._metadata = self._key_metadata("")
        self.call_overhead_s = call_overhead_s
        self.memory_bytes = memory_bytes
        self.max_output_bytes = max_output_bytes
        self._channel: aio.Channel = connect(
            target, default_timeout_s=30.0, retry=RetryPolicy(max_attempts=3)
        )
        self._endpoint = Endpoint(
            "sandbox", target, sandbox_pb2_grpc.SandboxServiceStub(self._channel)
        )

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

    def _limits(self, timeout_s: float) -> sandbox_pb2.Limits:
        return sandbox_pb2.Limits(
            timeout_s=timeout_s,
            memory_bytes=self.memory_bytes,
            max_output_bytes=self.max_output_bytes,
        )

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout_s: float,
        session_id: str = "",
        files: Sequence[tuple[str, bytes, bool]] = (),
    ) -> ExecOutcome:
        """Run a Python program (`timeout_s`: its wall-clock limit) inside session
        `session_id`, a `create_session` handle, when given (SessionGone if it is gone),
        with `files` (path, content, executable) written into its work dir first."""
        metadata = self._metadata
        handle = session_id
        if handle:
            session_id, metadata = self._open_handle(handle)
        request = sandbox_pb2.ExecuteRequest(
            language=sandbox_pb2.LANGUAGE_PYTHON,
            code=code,
            stdin=stdin,
            files=[sandbox_pb2.File(path=p, content=c, executable=x) for p, c, x in files],
            limits=self._limits(timeout_s),
            session_id=session_id,
        )

        def failed(rpc: RpcFailure) -> SandboxUnavailable:
            if handle and rpc.failure is Failure.GONE:
                return SessionGone(f"sandbox session {handle} is gone: {rpc.details}", rpc=rpc)
            return _unavailable(rpc)

        reply = await self._endpoint.call(
            "Execute",
            request,
            timeout_s=timeout_s + self.call_overhead_s,
            metadata=metadata,
            failed=failed,
        )
        status = _FROM_PROTO.get(reply.status, ExecStatus.SANDBOX_ERROR)
        return ExecOutcome(status, reply.stdout, reply.stderr, reply.exit_code, reply.wall_time_s)

    async def create_session(self, *, idle_timeout_s: float, timeout_s: float) -> str:
        """Open a stateful Python session under a client key of its own; its handle
        (pass it as `session_id`). `timeout_s` is the limit of each call in it;
        SandboxBusy when the sandbox's session limits are reached."""
        label = secrets.token_hex(16)
        request = sandbox_pb2.CreateSessionRequest(
            limits=self._limits(timeout_s), idle_timeout_s=idle_timeout_s
        )

        def failed(rpc: RpcFailure) -> SandboxUnavailable:
            if rpc.failure is Failure.BUSY:
                return SandboxBusy(rpc.message, transient=True, rpc=rpc)
            return _unavailable(rpc)

        # Starting a session starts its sandbox: allow for it like for a program start.
        reply = await self._endpoint.call(
            "CreateSession",
            request,
            timeout_s=self.call_overhead_s + timeout_s,
            metadata=self._key_metadata(label),
            failed=failed,
        )
        return f"{label}.{reply.session_id}"

    async def close_session(self, session_id: str) -> bool:
        """Close session `session_id` (a `create_session` handle); whether it still existed."""
        try:
            sandbox_id, metadata = self._open_handle(session_id)
        except SessionGone:
            return False
        reply = await self._endpoint.call(
            "CloseSession",
            sandbox_pb2.CloseSessionRequest(session_id=sandbox_id),
            timeout_s=self.call_overhead_s,
            metadata=metadata,
            failed=_unavailable,
        )
        return bool(reply.existed)

    async def close(self) -> None:
        await self._channel.close()
