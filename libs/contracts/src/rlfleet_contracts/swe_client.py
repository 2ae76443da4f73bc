"""The rlfleet.v1.SweRunnerService contract on the caller's side (the reward gateway's
`swe_agent` episodes): `SweRunnerClient` opens repository sessions, runs tool calls in
them, closes them, and evaluates a patch.

Every call has a deadline (the work's own time limit plus `call_overhead_s` for container
start-up and transfer), so a wedged runner costs one bounded wait. Failures go through
`rlfleet_core.calls`'s one classification, onto the sandbox contract's classes (the
gateway handles both alike): `SweRunnerBusy`, `SweSessionGone`, `SweRunnerUnavailable`
(a `SandboxUnavailable`: an error result on Step, UNAVAILABLE on OpenEpisode and a
SANDBOX_ERROR failure on CloseEpisode, never a wrong patch), and `SweToolRefused` for a
malformed tool call or session. Sessions belong to the client key this client sends as
`x-rlfleet-client-key` (a random secret per client), so no other caller reaches them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from grpc import aio
from rlfleet_core.calls import Endpoint, Failure, RpcFailure
from rlfleet_core.client import RetryPolicy, connect
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc

from rlfleet_contracts.sandbox_client import (
    CLIENT_KEY_METADATA,
    SandboxBusy,
    SandboxUnavailable,
    SessionGone,
    new_client_key,
)


class SweRunnerUnavailable(SandboxUnavailable):
    """The swe-runner could not do the call (unreachable, deadline, infra error)."""


class SweRunnerBusy(SandboxBusy):
    """The swe-runner refused a new session: its session limits are reached."""


class SweSessionGone(SessionGone):
    """The session is closed (its idle timeout, or the runner restarted)."""


class SweToolRefused(ValueError):
    """The runner refused the call as malformed (INVALID_ARGUMENT): the policy's fault on
    RunSweTool, the row's on OpenSweSession (an image that does not start). The message
    is the runner's own, which names the field."""


_REFUSABLE = ("RunSweTool", "OpenSweSession")
"""The calls whose INVALID_ARGUMENT is the request's fault; on the others it is the runner's."""


def _failed(rpc: RpcFailure) -> Exception:
    if rpc.failure is Failure.BUSY:
        return SweRunnerBusy(rpc.message, transient=True, rpc=rpc)
    if rpc.failure is Failure.GONE:
        return SweSessionGone(rpc.message, rpc=rpc)
    if rpc.failure is Failure.REFUSED and rpc.method in _REFUSABLE:
        return SweToolRefused(rpc.details)
    return SweRunnerUnavailable(rpc.message, transient=rpc.transient, rpc=rpc)


class SweRunnerClient:
    def __init__(
        self,
        target: str,
        *,
        call_overhead_s: float = 30.0,
        client_key: str | None = None,
    ) -> None:
        self.target = target
        self.call_overhead_s = call_overhead_s
        self._metadata = ((CLIENT_KEY_METADATA, client_key or new_client_key()),)
        self._channel: aio.Channel = connect(
            target, default_timeout_s=60.0, retry=RetryPolicy(max_attempts=3)
        )
        stub = swe_pb2_grpc.SweRunnerServiceStub(self._channel)
        self._endpoint = Endpoint("swe-runner", target, stub)

    async def _call(self, method: str, request: Any, timeout_s: float) -> Any:
        return await self._endpoint.call(
            method, request, timeout_s=timeout_s, metadata=self._metadata, failed=_failed
        )

    async def open_session(
        self,
        *,
        instance_id: str,
        image: str,
        workdir: str,
        base_commit: str,
        memory_bytes: int,
        idle_timeout_s: float,
    ) -> str:
        request = swe_pb2.SweOpenSessionRequest(
            instance_id=instance_id,
            image=image,
            workdir=workdir,
            base_commit=base_commit,
            memory_bytes=memory_bytes,
            idle_timeout_s=idle_timeout_s,
        )
        reply = await self._call("OpenSweSession", request, self.call_overhead_s)
        return str(reply.session_id)

    async def run_tool(
        self,
        session_id: str,
        tool: int,
        *,
        timeout_s: float,
        command: str = "",
        path: str = "",
        old_str: str = "",
        new_str: str = "",
    ) -> swe_pb2.SweRunToolReply:
        """One tool call; `timeout_s` is the command's own limit (the runner's watchdog)."""
        request = swe_pb2.SweRunToolRequest(
            session_id=session_id,
            tool=tool,  # type: ignore[arg-type]
            command=command,
            path=path,
            old_str=old_str,
            new_str=new_str,
            timeout_s=timeout_s,
        )
        reply: swe_pb2.SweRunToolReply = await self._call(
            "RunSweTool", request, timeout_s + self.call_overhead_s
        )
        return reply

    async def close_session(self, session_id: str) -> None:
        request = swe_pb2.SweCloseSessionRequest(session_id=session_id)
        with contextlib.suppress(SweSessionGone):  # gone already: nothing to free
            await self._call("CloseSweSession", request, self.call_overhead_s)

    async def evaluate(
        self,
        *,
        instance_id: str,
        image: str,
        workdir: str,
        patch: str,
        test_patch: str,
        test_command: str,
        fail_to_pass: Sequence[str],
        pass_to_pass: Sequence[str],
        timeout_s: float,
        memory_bytes: int,
    ) -> swe_pb2.EvaluateResult:
        request = swe_pb2.EvaluateRequest(
            instance_id=instance_id,
            image=image,
            workdir=workdir,
            patch=patch,
            test_patch=test_patch,
            test_command=test_command,
            fail_to_pass=list(fail_to_pass),
            pass_to_pass=list(pass_to_pass),
            timeout_s=timeout_s,
            memory_bytes=memory_bytes,
        )
        result: swe_pb2.EvaluateResult = await self._call(
            "Evaluate", request, timeout_s + self.call_overhead_s
        )
        return result

    async def close(self) -> None:
        await self._channel.close()
