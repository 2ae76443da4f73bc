"""gRPC face: SandboxService translated to and from the engine's domain types."""

from __future__ import annotations

from typing import Any

from grpc import aio
from rlfleet_core.auth import grpc_client_key as client_key
from rlfleet_core.errors import InvalidArgument
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc

from rlfleet_sandbox.config import LIMIT_NAMES
from rlfleet_sandbox.engine import SandboxEngine
from rlfleet_sandbox.sessions import check_session_id
from rlfleet_sandbox.types import ExecRequest, ExecResult, InputFile, Language, check_file_path

_LANGUAGES = {
    sandbox_pb2.LANGUAGE_PYTHON: Language.PYTHON,
    sandbox_pb2.LANGUAGE_BASH: Language.BASH,
}
_STATUS = {
    "OK": sandbox_pb2.EXEC_STATUS_OK,
    "ERROR": sandbox_pb2.EXEC_STATUS_ERROR,
    "TIMEOUT": sandbox_pb2.EXEC_STATUS_TIMEOUT,
    "MEMORY": sandbox_pb2.EXEC_STATUS_MEMORY,
    "OUTPUT_LIMIT": sandbox_pb2.EXEC_STATUS_OUTPUT_LIMIT,
    "SANDBOX_ERROR": sandbox_pb2.EXEC_STATUS_SANDBOX_ERROR,
}


def limits_from_proto(limits: sandbox_pb2.Limits) -> dict[str, float]:
    return {name: getattr(limits, name) for name in LIMIT_NAMES}


def request_from_proto(
    engine: SandboxEngine, request: sandbox_pb2.ExecuteRequest, key: str | None = None
) -> ExecRequest:
    language = _LANGUAGES.get(request.language)
    if language is None:
        raise InvalidArgument(
            "language",
            "must be LANGUAGE_PYTHON or LANGUAGE_BASH, got "
            f"{sandbox_pb2.Language.Name(request.language) if request.language in sandbox_pb2.Language.values() else request.language}",
        )
    files = tuple(
        InputFile(check_file_path(f.path, i), f.content, f.executable)
        for i, f in enumerate(request.files)
    )
    session_id = check_session_id(request.session_id) if request.session_id else ""
    owner = engine.owner(key) if session_id else ""
    return ExecRequest(
        language=language,
        code=request.code,
        limits=engine.limits(limits_from_proto(request.limits)),
        stdin=request.stdin.encode(),
        files=files,
        session_id=session_id,
        owner=owner,
    )


def result_to_proto(result: ExecResult) -> sandbox_pb2.ExecuteResult:
    return sandbox_pb2.ExecuteResult(
        status=_STATUS[result.status.value],
        stdout=result.stdout.decode(errors="replace"),
        stderr=result.stderr.decode(errors="replace"),
        exit_code=result.exit_code,
        signal=result.signal,
        wall_time_s=result.wall_time_s,
        cpu_time_s=result.cpu_time_s,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
    )


class SandboxServicer(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self, engine: SandboxEngine) -> None:
        self.engine = engine

    async def Execute(
        self, request: sandbox_pb2.ExecuteRequest, context: aio.ServicerContext[Any, Any]
    ) -> sandbox_pb2.ExecuteResult:
        result = await self.engine.execute(
            request_from_proto(self.engine, request, client_key(context))
        )
        return result_to_proto(result)

    async def CreateSession(
        self, request: sandbox_pb2.CreateSessionRequest, context: aio.ServicerContext[Any, Any]
    ) -> sandbox_pb2.Session:
        owner = self.engine.owner(client_key(context))
        limits = self.engine.limits(limits_from_proto(request.limits))
        session = await self.engine.create_session(owner, limits, request.idle_timeout_s)
        return sandbox_pb2.Session(
            session_id=session.session_id, idle_timeout_s=session.idle_timeout_s
        )

    async def CloseSession(
        self, request: sandbox_pb2.CloseSessionRequest, context: aio.ServicerContext[Any, Any]
    ) -> sandbox_pb2.CloseSessionResponse:
        session_id = check_session_id(request.session_id)
        existed = await self.engine.close_session(
            self.engine.owner(client_key(context)), session_id
        )
        return sandbox_pb2.CloseSessionResponse(existed=existed)
