"""Tool routes of environments whose policy calls tools during an episode (NeMo-Gym's
`POST /{tool_name}` of a resources server, here under the environment's prefix):

- `POST /math_with_code/execute_python` `{"code": "..."}` -> ExecutePythonResponse
  (python_tool.py): runs the code in the episode's stateful sandbox session.
- `POST /math_with_code/end_session` -> `{"success": true, "existed": bool}`: closes it.

An episode belongs to its caller. The caller is named by a secret only it holds: its
`x-rlfleet-client-key` header when it sends one (16-256 printable characters, the same
on every call), else the `rlfleet_tool_caller` cookie that the gateway mints on the
first call (256 random bits) and sets again on every answer (NeMo-Gym's agents pass on
the cookies of the last answer, as they do for NeMo-Gym's own session cookie). The
optional `X-Session-ID` header (0-128 of A-Z a-z 0-9 _ . : -) names one of the
caller's episodes; without it the caller has one episode. Episodes are found by
(caller, name): another caller sending the same `X-Session-ID` reaches an episode of
its own, fresh, never this one; a client that keeps neither cookies nor a key starts a
new episode on every call.

Errors: 422 naming the field (`code`, `x-session-id`, `x-rlfleet-client-key`, the
cookie) for a malformed call, 404 when the environment is not enabled, 429 when the
session limits are reached, 503 when no sandbox is configured (`sandbox.target`) or it
cannot be reached.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from rlfleet_contracts.sandbox_client import SandboxBusy, SandboxClient, SandboxUnavailable
from rlfleet_core.auth import CLIENT_KEY_HEADER, owner_of
from rlfleet_core.errors import InvalidArgument

from rlfleet_reward.gateway import Gateway
from rlfleet_reward.python_tool import EPISODE_KEY, PythonToolSessions

SESSION_HEADER = "x-session-id"
CALLER_COOKIE = "rlfleet_tool_caller"
_TOOL_ENV = "math_with_code"


def _error(status: int, field: str, problem: str) -> JSONResponse:
    where = {SESSION_HEADER: "header", CLIENT_KEY_HEADER: "header", CALLER_COOKIE: "cookie"}
    loc = [where.get(field, "body"), field]
    detail = [{"loc": loc, "msg": problem, "type": "value_error"}]
    return JSONResponse(status_code=status, content={"detail": detail, "field": field})


def caller_of(request: Request) -> tuple[str, str | None]:
    """(caller, cookie to set) of a tool call: the hash of the caller's client key, or of
    its cookie (set again on the answer), or of a cookie minted now. InvalidArgument
    names a malformed key or cookie."""
    key = request.headers.get(CLIENT_KEY_HEADER)
    if key is not None:
        return owner_of(key, allow_keyless=False), None
    cookie = request.cookies.get(CALLER_COOKIE)
    if cookie is None:
        cookie = secrets.token_urlsafe(32)
    try:
        return owner_of(cookie, allow_keyless=False), cookie
    except InvalidArgument:
        raise InvalidArgument(
            CALLER_COOKIE, "use 16-256 printable ASCII characters (or drop it: one is minted)"
        ) from None


async def _read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (judged from Content-Length when
    given, else while reading: a huge body is never held)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def add_tool_routes(app: FastAPI, gateway: Gateway) -> None:
    """Add the tool routes of the enabled tool-using environments to `app`."""
    if _TOOL_ENV not in gateway.enabled:
        return
    sessions: list[PythonToolSessions] = []  # made on first use: no channel unless needed

    def tool_sessions() -> PythonToolSessions | None:
        sandbox = gateway.config.sandbox
        if not sessions and sandbox.target:
            client = SandboxClient(
                sandbox.target,
                call_overhead_s=sandbox.call_overhead_s,
                memory_bytes=sandbox.memory_bytes,
            )
            sessions.append(PythonToolSessions(client))
        return sessions[0] if sessions else None

    async def call(
        request: Request,
        work: Callable[[PythonToolSessions, tuple[str, str], dict[str, Any]], Awaitable[Any]],
    ) -> JSONResponse:
        episode = request.headers.get(SESSION_HEADER, "")
        if not EPISODE_KEY.match(episode):
            return _error(
                422, SESSION_HEADER, "the episode's name: 0-128 of A-Za-z0-9_.:-, or no header"
            )
        try:
            caller, cookie = caller_of(request)
        except InvalidArgument as exc:
            return _error(422, exc.field, str(exc).partition(": ")[2])
        answer = await answer_for(request, work, (caller, episode))
        if cookie is not None:
            # Every answer carries it: NeMo-Gym's agents send back the last answer's cookies.
            answer.set_cookie(CALLER_COOKIE, cookie, httponly=True, samesite="strict")
        return answer

    async def answer_for(
        request: Request,
        work: Callable[[PythonToolSessions, tuple[str, str], dict[str, Any]], Awaitable[Any]],
        key: tuple[str, str],
    ) -> JSONResponse:
        limit = gateway.config.limits.max_request_bytes
        raw = await _read_bounded(request, limit)
        if raw is None:
            return _error(413, "", f"body over limits.max_request_bytes ({limit})")
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return _error(422, "", "the body must be a JSON object")
        if not isinstance(body, dict):
            return _error(422, "", "the body must be a JSON object")
        tools = tool_sessions()
        if tools is None:
            return JSONResponse(
                status_code=503,
                content={"detail": f"{_TOOL_ENV} tools need a sandbox: set sandbox.target"},
            )
        try:
            return JSONResponse(await work(tools, key, body))
        except SandboxBusy as exc:
            return JSONResponse(
                status_code=429, content={"detail": str(exc)}, headers={"Retry-After": "1"}
            )
        except SandboxUnavailable as exc:
            return JSONResponse(status_code=503, content={"detail": str(exc)})
        except ValueError as exc:
            field, _, problem = str(exc).partition(": ")
            return _error(422, field, problem)

    async def execute(tools: PythonToolSessions, key: tuple[str, str], body: dict[str, Any]) -> Any:
        code = body.get("code")
        if not isinstance(code, str):
            raise ValueError("code: required: the Python program to run, as a string")
        if len(code) > tools.limits.max_code_chars:
            raise ValueError(f"code: longer than {tools.limits.max_code_chars} characters")
        return await tools.execute(*key, code)

    async def end(tools: PythonToolSessions, key: tuple[str, str], body: dict[str, Any]) -> Any:
        return {"success": True, "existed": await tools.end(*key)}

    @app.post(f"/{_TOOL_ENV}/execute_python")
    async def execute_python(request: Request) -> JSONResponse:
        return await call(request, execute)

    @app.post(f"/{_TOOL_ENV}/end_session")
    async def end_session(request: Request) -> JSONResponse:
        return await call(request, end)
