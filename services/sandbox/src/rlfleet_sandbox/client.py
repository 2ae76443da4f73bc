"""Client helpers of the sandbox service: every call carries the client's secret key
(`x-rlfleet-client-key`), which makes the sessions it creates its own. A client object
without a configured key makes a random one, so two client objects never share sessions;
pass the same key to share them across processes or restarts."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from grpc import aio
from rlfleet_core.client import connect
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc

from rlfleet_sandbox.sessions import CLIENT_KEY_HEADER


def new_client_key() -> str:
    """A fresh random client key (256 bits)."""
    return secrets.token_urlsafe(32)


class ClientKeyInterceptor(aio.UnaryUnaryClientInterceptor):
    """Adds `x-rlfleet-client-key` to every unary call of a channel."""

    def __init__(self, client_key: str) -> None:
        self._entry = (CLIENT_KEY_HEADER, client_key)

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        metadata = aio.Metadata(*(client_call_details.metadata or ()), self._entry)
        details = client_call_details._replace(metadata=metadata)
        return await continuation(details, request)


class SandboxClient:
    """Execute and sessions over gRPC, as one client (one key)."""

    def __init__(
        self, target: str, *, client_key: str | None = None, default_timeout_s: float = 60.0
    ) -> None:
        self.client_key = client_key or new_client_key()
        self._channel = connect(target, default_timeout_s=default_timeout_s)
        self.stub = sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((CLIENT_KEY_HEADER, self.client_key),)

    async def execute(
        self, request: sandbox_pb2.ExecuteRequest, timeout_s: float | None = None
    ) -> sandbox_pb2.ExecuteResult:
        result: sandbox_pb2.ExecuteResult = await self.stub.Execute(
            request, metadata=self.metadata, timeout=timeout_s
        )
        return result

    async def create_session(
        self, request: sandbox_pb2.CreateSessionRequest | None = None
    ) -> sandbox_pb2.Session:
        session: sandbox_pb2.Session = await self.stub.CreateSession(
            request or sandbox_pb2.CreateSessionRequest(), metadata=self.metadata
        )
        return session

    async def close_session(self, session_id: str) -> bool:
        response = await self.stub.CloseSession(
            sandbox_pb2.CloseSessionRequest(session_id=session_id), metadata=self.metadata
        )
        return bool(response.existed)

    async def close(self) -> None:
        await self._channel.close()
