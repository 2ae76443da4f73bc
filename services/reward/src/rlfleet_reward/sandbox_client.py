"""The `code` environment's view of the sandbox service: one method, behind a Protocol.

`GrpcSandboxClient` calls rlfleet.v1.SandboxService.Execute with a deadline on every call
(the program's own time limit plus a fixed allowance for start-up and transfer), so a
wedged sandbox costs one bounded wait, never a hung reward call (NeMo-RL PR #3666).
Transport failures become `SandboxUnavailable`, which the environment reports as a
SANDBOX_ERROR failure rather than as a wrong program.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

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
    ) -> None:
        self.target = target
        self.call_overhead_s = call_overhead_s
        self.memory_bytes = memory_bytes
        self.max_output_bytes = max_output_bytes
        self._channel: aio.Channel = connect(
            target, default_timeout_s=30.0, retry=RetryPolicy(max_attempts=3)
        )
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    async def execute(self, code: str, *, stdin: str = "", timeout_s: float) -> ExecOutcome:
        request = sandbox_pb2.ExecuteRequest(
            language=sandbox_pb2.LANGUAGE_PYTHON,
            code=code,
            stdin=stdin,
            limits=sandbox_pb2.Limits(
                timeout_s=timeout_s,
                memory_bytes=self.memory_bytes,
                max_output_bytes=self.max_output_bytes,
            ),
        )
        try:
            reply = await self._stub.Execute(request, timeout=timeout_s + self.call_overhead_s)
        except aio.AioRpcError as exc:
            raise SandboxUnavailable(
                f"sandbox {self.target} Execute failed: {exc.code().name}: {exc.details()}"
            ) from None
        status = _FROM_PROTO.get(reply.status, ExecStatus.SANDBOX_ERROR)
        return ExecOutcome(status, reply.stdout, reply.stderr, reply.exit_code, reply.wall_time_s)

    async def close(self) -> None:
        await self._channel.close()
