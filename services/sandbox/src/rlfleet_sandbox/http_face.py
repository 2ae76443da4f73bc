"""HTTP face compatible with the NeMo-Skills sandbox (what NeMo-Gym tool servers call).

POST /execute takes `generated_code`, `timeout` (s), `language` (`ipython` = stateful
Python when a session id is given, else one-shot Python; `python3`/`python`; `bash`),
`std_input` and `session_id` (in the body, as older NeMo-Skills releases send it, or in
the `X-Session-ID` header, as newer ones do), and answers `process_status`
(`completed` | `error` | `timeout` | `failed`), `stdout`, `stderr`, plus our own fields
(`status`, `exit_code`, times, truncation flags). Unknown body fields are ignored, as the
original server does. GET /health, GET /sessions, DELETE /sessions/{id} as there.

Sessions belong to the `x-rlfleet-client-key` header's client (see sessions.py). A call
without the header (what NeMo-Skills sends) uses the keyless namespace, where the session
id is the capability: no keyed client's session is reachable from there, and keyless ids
are never listed. A stateful answer says `new_session_created` (true when this call
started the session or its interpreter afresh), which NeMo-Skills' client reads to replay
a lost session's history. A body
over `http.max_body_bytes` is refused (413) before it is parsed, and every /execute call
ends within `http.deadline_s` (504), waiting for a sandbox included.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from rlfleet_core.errors import InvalidArgument, ServiceError

from rlfleet_sandbox.engine import SandboxEngine
from rlfleet_sandbox.sessions import ANONYMOUS, CLIENT_KEY_HEADER, check_session_id
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
    return failed(_HTTP_CODES.get(exc.code.name, 500), exc.message)


def failed(status_code: int, message: str) -> JSONResponse:
    return JSONResponse(
        status_code=status_code,
        content={"process_status": "failed", "stdout": "", "stderr": message, "detail": message},
    )


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused past `max_bytes` whether or not Content-Length says so
    (a chunked body is counted as it arrives)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class BodyFieldError(InvalidArgument):
    """A field of the body has the wrong type or is missing (HTTP 422, as FastAPI says)."""


def parse_body(raw: bytes) -> ExecuteBody:
    """ExecuteBody from raw JSON; errors name the field (400 bad JSON, 422 bad field)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument("body", f"is not valid JSON ({str(exc)[:200]})") from None
    try:
        return ExecuteBody.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BodyFieldError(where, first["msg"]) from None


def utf8(value: str, field: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            field, f"is not valid Unicode text (lone surrogate at index {exc.start})"
        ) from None


async def execute(
    engine: SandboxEngine, body: ExecuteBody, header_session: str | None, key: str | None
) -> dict[str, Any]:
    language = _LANGUAGES.get(body.language)
    if language is None:
        raise InvalidArgument(
            "language",
            f"{body.language!r} is not supported here; use one of {', '.join(sorted(_LANGUAGES))}",
        )
    if not math.isfinite(body.timeout) or body.timeout < 0:
        raise InvalidArgument("timeout", f"must be >= 0 seconds (0 = default), got {body.timeout}")
    utf8(body.generated_code, "generated_code")
    stdin = utf8(body.std_input, "std_input")
    limits = engine.limits({"timeout_s": body.timeout})
    session_id = body.session_id or header_session or ""
    owner = ""
    created = False
    if body.language != "ipython" or not session_id:
        session_id = ""
    else:
        check_session_id(session_id)
        owner = engine.owner(key)
        if not engine.sessions.exists(owner, session_id):
            # NeMo-Skills clients name sessions themselves and never create them first.
            await engine.create_session(owner, limits, 0.0, session_id)
            created = True
    request = ExecRequest(
        language=language,
        code=body.generated_code,
        limits=limits,
        stdin=stdin,
        session_id=session_id,
        owner=owner,
    )
    answer = result_body(await engine.execute(request))
    if session_id:
        answer["new_session_created"] = created or bool(answer.get("session_reset"))
    return answer


ClientKey = Annotated[str | None, Header(alias=CLIENT_KEY_HEADER)]
"""The caller's `x-rlfleet-client-key` header (None for keyless callers)."""


def owner_or_refusal(engine: SandboxEngine, key: str | None) -> str | JSONResponse:
    """The session namespace of the client whose key is `key`, or the answer refusing
    the key."""
    try:
        return engine.owner(key)
    except ServiceError as exc:
        return error_response(exc)


def add_routes(app: FastAPI, engine: SandboxEngine) -> None:
    config = engine.config.http

    @app.post("/execute", response_model=None)
    async def post_execute(
        request: Request,
        x_session_id: str | None = Header(default=None),
        x_rlfleet_client_key: ClientKey = None,
    ) -> dict[str, Any] | JSONResponse:
        try:
            async with asyncio.timeout(config.deadline_s):
                try:
                    raw = await read_body(request, config.max_body_bytes)
                except BodyTooLarge:
                    return failed(
                        413,
                        f"body: larger than {config.max_body_bytes} bytes (http.max_body_bytes)",
                    )
                body = parse_body(raw)
                return await execute(engine, body, x_session_id, x_rlfleet_client_key)
        except BodyFieldError as exc:
            return failed(422, exc.message)
        except ServiceError as exc:
            return error_response(exc)
        except TimeoutError:
            return failed(
                504, f"the call did not finish within {config.deadline_s} s (http.deadline_s)"
            )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "healthy",
            "pool_idle": engine.pool.idle,
            "sessions": engine.sessions.open_count,
        }

    @app.get("/sessions", response_model=None)
    async def sessions(
        x_rlfleet_client_key: ClientKey = None,
    ) -> dict[str, Any] | JSONResponse:
        owner = owner_or_refusal(engine, x_rlfleet_client_key)
        if isinstance(owner, JSONResponse):
            return owner
        if owner == ANONYMOUS:
            return {
                "sessions": [],
                "note": "keyless sessions are not listed: their ids are their only protection; "
                f"send {CLIENT_KEY_HEADER} to list your own",
            }
        return {
            "sessions": [
                {
                    "session_id": s.session_id,
                    "idle_s": round(s.idle_s, 3),
                    "idle_timeout_s": s.idle_timeout_s,
                    "calls": s.calls,
                    "created_unix_s": s.created_unix_s,
                }
                for s in engine.list_sessions(owner)
            ]
        }

    @app.delete("/sessions/{session_id}", response_model=None)
    async def delete_session(
        session_id: str,
        x_rlfleet_client_key: ClientKey = None,
    ) -> dict[str, Any] | JSONResponse:
        owner = owner_or_refusal(engine, x_rlfleet_client_key)
        if isinstance(owner, JSONResponse):
            return owner
        if not await engine.close_session(owner, session_id):
            return JSONResponse(
                status_code=404,
                content={
                    "detail": f"session {session_id!r} does not exist (closed, expired or never created)"
                },
            )
        return {"session_id": session_id, "closed": True}
