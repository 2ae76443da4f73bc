"""HTTP face compatible with the NeMo-Skills sandbox (what NeMo-Gym tool servers call).

POST /execute takes `generated_code`, `timeout` (s), `language` (`ipython` = stateful
Python when a session id is given, else one-shot Python; `python3`/`python`; `bash`),
`std_input` and `session_id` (in the body, as older NeMo-Skills releases send it, or in
the `X-Session-ID` header, as newer ones do), and answers `process_status`
(`completed` | `error` | `timeout` | `failed`), `stdout`, `stderr`, plus our own fields
(`status`, `exit_code`, times, truncation flags). Unknown body fields are ignored, as the
original server does. GET /health, GET /sessions, DELETE /sessions/{id} as there.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from rlfleet_core.errors import InvalidArgument, ServiceError

from rlfleet_sandbox.engine import SandboxEngine
from rlfleet_sandbox.sessions import check_session_id
from rlfleet_sandbox.types import ExecRequest, ExecResult, Language, Status

PROCESS_STATUS = {
    Status.OK: "completed",
    Status.ERROR: "error",
    Status.MEMORY: "error",
    Status.OUTPUT_LIMIT: "error",
    Status.TIMEOUT: "timeout",
    Status.SANDBOX_ERROR: "failed",
}
_LANGUAGES = {
    "python3": Language.PYTHON,
    "python": Language.PYTHON,
    "ipython": Language.PYTHON,
    "bash": Language.BASH,
}
_HTTP_CODES = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "FAILED_PRECONDITION": 409,
}


class ExecuteBody(BaseModel):
    """The NeMo-Skills /execute request."""

    model_config = ConfigDict(extra="ignore")

    generated_code: str
    timeout: float = 0.0
    """Seconds; 0 or absent = the service default, more than the cap is clamped."""
    language: str = "ipython"
    std_input: str = ""
    session_id: str | None = None
    traceback_verbosity: str | None = None
    """Accepted for compatibility; tracebacks are always Python's own."""


def result_body(result: ExecResult) -> dict[str, Any]:
    return {
        "process_status": PROCESS_STATUS[result.status],
        "stdout": result.stdout.decode(errors="replace"),
        "stderr": result.stderr.decode(errors="replace"),
        "status": result.status.value,
        "exit_code": result.exit_code,
        "signal": result.signal,
        "wall_time_s": round(result.wall_time_s, 6),
        "cpu_time_s": round(result.cpu_time_s, 6),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        **result.extra,
    }


def error_response(exc: ServiceError) -> JSONResponse:
    """Errors in the same shape as results, so clients that only read the body still
    see why (`process_status: failed`), with an HTTP code that says it too."""
    return JSONResponse(
        status_code=_HTTP_CODES.get(exc.code.name, 500),
        content={
            "process_status": "failed",
            "stdout": "",
            "stderr": exc.message,
            "detail": exc.message,
        },
    )


async def execute(
    engine: SandboxEngine, body: ExecuteBody, header_session: str | None
) -> dict[str, Any]:
    language = _LANGUAGES.get(body.language)
    if language is None:
        raise InvalidArgument(
            "language",
            f"{body.language!r} is not supported here; use one of {', '.join(sorted(_LANGUAGES))}",
        )
    if body.timeout < 0:
        raise InvalidArgument("timeout", f"must be >= 0 seconds (0 = default), got {body.timeout}")
    limits = engine.limits({"timeout_s": body.timeout})
    session_id = body.session_id or header_session or ""
    if body.language != "ipython" or not session_id:
        session_id = ""
    else:
        check_session_id(session_id)
        if session_id not in engine.sessions:
            # NeMo-Skills clients name sessions themselves and never create them first.
            await engine.create_session(limits, 0.0, session_id)
    request = ExecRequest(
        language=language,
        code=body.generated_code,
        limits=limits,
        stdin=body.std_input.encode(),
        session_id=session_id,
    )
    return result_body(await engine.execute(request))


def add_routes(app: FastAPI, engine: SandboxEngine) -> None:
    @app.post("/execute", response_model=None)
    async def post_execute(
        body: ExecuteBody, x_session_id: str | None = Header(default=None)
    ) -> dict[str, Any] | JSONResponse:
        try:
            return await execute(engine, body, x_session_id)
        except ServiceError as exc:
            return error_response(exc)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "healthy",
            "pool_idle": engine.pool.idle,
            "sessions": len(engine.sessions.list()),
        }

    @app.get("/sessions")
    async def sessions() -> dict[str, Any]:
        return {
            "sessions": [
                {
                    "session_id": s.session_id,
                    "idle_s": round(s.idle_s, 3),
                    "idle_timeout_s": s.idle_timeout_s,
                    "calls": s.calls,
                    "created_unix_s": s.created_unix_s,
                }
                for s in engine.list_sessions()
            ]
        }

    @app.delete("/sessions/{session_id}", response_model=None)
    async def delete_session(session_id: str) -> dict[str, Any] | JSONResponse:
        if not await engine.close_session(session_id):
            return JSONResponse(
                status_code=404,
                content={
                    "detail": f"session {session_id!r} does not exist (closed, expired or never created)"
                },
            )
        return {"session_id": session_id, "closed": True}
