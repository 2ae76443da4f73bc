"""The `swe_agent` episode environment's view of the swe-runner service.

`GrpcSweRunnerClient` calls rlfleet.v1.SweRunnerService with a deadline on every call (the
work's own time limit plus `swe.call_overhead_s` for container start-up and transfer), so
a wedged runner costs one bounded wait. Transport failures and the runner's own errors
become `SweRunnerUnavailable` (a `SandboxUnavailable`: the episode manager reports it as
an error result on Step, UNAVAILABLE on OpenEpisode and a SANDBOX_ERROR failure on
CloseEpisode, never as a wrong patch). Sessions belong to the client key this client sends
as `x-rlfleet-client-key` (a random secret per client), so no other caller reaches them.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import grpc
from grpc import aio
from rlfleet_core.client import RetryPolicy, connect
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc

from rlfleet_reward.sandbox_client import (
    CLIENT_KEY_METADATA,
    SandboxBusy,
    SandboxUnavailable,
    SessionGone,
)


class SweRunnerUnavailable(SandboxUnavailable):
    """The swe-runner could not do the call (unreachable, deadline, infra error)."""


class SweRunnerBusy(SandboxBusy):
    """The swe-runner refused a new session: its session limits are reached."""


class SweSessionGone(SessionGone):
    """The session is closed (its idle timeout, or the runner restarted)."""


class SweToolRefused(ValueError):
    """The runner refused the call as malformed (INVALID_ARGUMENT): the policy's fault on
    RunSweTool, the row's on OpenSweSession (an image that does not start)."""


class GrpcSweRunnerClient:
    def __init__(
        self,
        target: str,
        *,
        call_overhead_s: float = 30.0,
        client_key: str | None = None,
    ) -> None:
        self.target = target
        self.call_overhead_s = call_overhead_s
        self._metadata = ((CLIENT_KEY_METADATA, client_key or secrets.token_urlsafe(32)),)
        self._channel: aio.Channel = connect(
            target, default_timeout_s=60.0, retry=RetryPolicy(max_attempts=3)
        )
        self._stub = swe_pb2_grpc.SweRunnerServiceStub(self._channel)

    def _failed(self, call: str, exc: aio.AioRpcError) -> Exception:
        said = f"swe-runner {self.target} {call} failed: {exc.code().name}: {exc.details()}"
        if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return SweRunnerBusy(said)
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            return SweSessionGone(said)
        if exc.code() is grpc.StatusCode.INVALID_ARGUMENT and call in (
            "RunSweTool",
            "OpenSweSession",
        ):
            return SweToolRefused(str(exc.details()))
        return SweRunnerUnavailable(said)

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
        try:
            reply = await self._stub.OpenSweSession(
                request, timeout=self.call_overhead_s, metadata=self._metadata
            )
        except aio.AioRpcError as exc:
            raise self._failed("OpenSweSession", exc) from None
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
        try:
            reply: swe_pb2.SweRunToolReply = await self._stub.RunSweTool(
                request, timeout=timeout_s + self.call_overhead_s, metadata=self._metadata
            )
        except aio.AioRpcError as exc:
            raise self._failed("RunSweTool", exc) from None
        return reply

    async def close_session(self, session_id: str) -> None:
        try:
            await self._stub.CloseSweSession(
                swe_pb2.SweCloseSessionRequest(session_id=session_id),
                timeout=self.call_overhead_s,
                metadata=self._metadata,
            )
        except aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.NOT_FOUND:  # gone already: nothing to free
                raise self._failed("CloseSweSession", exc) from None

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
        try:
            result: swe_pb2.EvaluateResult = await self._stub.Evaluate(
                request, timeout=timeout_s + self.call_overhead_s, metadata=self._metadata
            )
        except aio.AioRpcError as exc:
            raise self._failed("Evaluate", exc) from None
        return result

    async def close(self) -> None:
        await self._channel.close()
