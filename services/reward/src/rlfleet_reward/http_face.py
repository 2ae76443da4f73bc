"""NeMo-Gym-compatible HTTP face: the routes of a NeMo-Gym resources server, once per
environment (`/{env}/...`, like one resources server each; NeMo-Gym server names such as
`math_with_judge` work as `{env}` too) and at the root, where `/verify` routes on the
row's `env`, `agent_ref.name` or `task_source` (NeMo-Gym agent names mapped by
`rlfleet_contracts.rows.NEMO_GYM_NAMES`):

- `POST /verify`: score one response (below).
- `POST /seed_session`: verifiable environments keep no per-episode state; answers `{}`,
  or `{"resources_session_id": id}` to an Environment Server's seed that carries one.
- `POST /close_session`: `{"resources_session_id": id}` back (nothing to release).
- `POST /aggregate_metrics`: `{"verify_responses": [...]}` -> NeMo-Gym's AggregateMetrics
  (`nemo_gym_metrics.py` says what is computed).
- `GET /reverify_mode`: `"stateless"` (verifying the same request again gives the same
  verdict, so NeMo-Gym may re-verify stored rollouts here).

Request: a NeMo-Gym verify request — `responses_create_params`, `response` (an OpenAI
Responses object: assistant text in `output` items of type `message` with `output_text`
parts, reasoning in `reasoning` items, tool calls in `function_call` items, token count
in `usage.output_tokens`) and the environment's row fields.
Answer: the request echoed back plus `reward`, `reward_components`, `failure_kind`,
`failure_reason`, `mask_sample` (NeMo-Gym 0.7 names) and `verifier_info`.
A malformed request gets 422 naming the field (FastAPI's `detail` shape, plus `field`),
one over a size limit (`limits.*`) 413 in the same shape, a full queue 429 — all before
any scoring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from rlfleet_contracts.rows import NEMO_GYM_NAMES, env_ref, unknown_env_problem
from rlfleet_core.errors import InvalidArgument
from starlette.routing import Route

from rlfleet_reward import metrics
from rlfleet_reward.config import LimitsConfig
from rlfleet_reward.environments.tool_use import decode_arguments
from rlfleet_reward.gateway import Gateway
from rlfleet_reward.limits import JsonCheck, NotJson, TooLarge, check_size, loads
from rlfleet_reward.nemo_gym_metrics import aggregate_metrics
from rlfleet_reward.text import split_reasoning
from rlfleet_reward.tool_routes import add_tool_routes
from rlfleet_reward.types import Overloaded, Sample, Score, ToolCall

_RESPONSE_KEYS = (
    "reward",
    "reward_components",
    "failure_kind",
    "failure_reason",
    "mask_sample",
    "verifier_info",
)


def _part_texts(parts: Any, field: str) -> list[str]:
    if parts is None:
        return []
    if isinstance(parts, str):
        return [parts]
    if not isinstance(parts, list):
        raise InvalidArgument(
            field, f"expected a list of content parts, got {type(parts).__name__}"
        )
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise InvalidArgument(f"{field}[{j}]", "expected a content part object")
        if part.get("type") in (
            "output_text",
            "text",
            "summary_text",
            "reasoning_text",
        ) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


_MAX_TOKENS = (1 << 31) - 1
# An oversized body is read and dropped up to this many times the limit, so the client
# (still sending) gets the 413 rather than a reset connection; beyond it we hang up.
_DRAIN_FACTOR = 8

Answer = Callable[[Request], Awaitable[Any]]
"""What a NeMo-Gym route answers (JSON-able) to a request; InvalidArgument for a bad one."""


def _arguments(raw: Any, field: str, check: JsonCheck) -> dict[str, Any] | None:
    """A function_call's arguments as an object; None if the model wrote no JSON object
    (a wrong call, scored as such); InvalidArgument if they break `limits`."""
    if isinstance(raw, str) and raw.strip():
        try:
            raw = loads(raw, field, check.limits)
        except NotJson:
            return None
        check.check(raw, field)
    return decode_arguments(raw)


def sample_from_response(response: Any, check: JsonCheck) -> Sample:
    """A `Sample` from an OpenAI Responses object; InvalidArgument names a malformed part.
    `check` has already seen the object; it bounds the tool-call arguments decoded here."""
    if not isinstance(response, dict):
        raise InvalidArgument(
            "response", "required: an OpenAI Responses object with `output` items"
        )
    output = response.get("output")
    if not isinstance(output, list):
        raise InvalidArgument("response.output", "required: a list of output items")
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    for i, item in enumerate(output):
        where = f"response.output[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgument(where, "expected an output item object")
        kind = item.get("type")
        if kind == "message":
            texts += _part_texts(item.get("content"), f"{where}.content")
        elif kind == "reasoning":
            reasoning += _part_texts(item.get("summary"), f"{where}.summary")
            reasoning += _part_texts(item.get("content"), f"{where}.content")
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise InvalidArgument(f"{where}.name", "required for a function_call item")
            arguments = _arguments(item.get("arguments", "{}"), f"{where}.arguments", check)
            # The model wrote arguments that are not a JSON object: a wrong call, not a bad request.
            calls.append(
                ToolCall(
                    item["name"],
                    arguments
                    if arguments is not None
                    else {"<unparsable arguments>": str(item.get("arguments"))},
                )
            )
    answer, think = split_reasoning("\n".join(texts))
    usage = response.get("usage") or {}
    tokens = usage.get("output_tokens", 0) if isinstance(usage, dict) else 0
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= _MAX_TOKENS:
        raise InvalidArgument(
            "response.usage.output_tokens",
            f"expected an integer in [0, {_MAX_TOKENS}], got {str(tokens)[:50]}",
        )
    return Sample(
        text=answer,
        reasoning_text="\n".join([*reasoning, think]).strip(),
        num_tokens=tokens,
        tool_calls=tuple(calls),
        output_text="".join(texts),  # NeMo-Gym's own join: no separator, <think> kept
    )


def verify_response(body: dict[str, Any], score: Score) -> dict[str, Any]:
    return {
        **{k: v for k, v in body.items() if k not in _RESPONSE_KEYS},
        "reward": score.reward,
        "reward_components": score.components,
        "failure_kind": score.failure_kind.wire_name,
        "failure_reason": score.failure_reason or None,
        "mask_sample": score.mask_sample,
        "verifier_info": score.info,
    }


def _unprocessable(field: str, problem: str, status: int = 422) -> JSONResponse:
    loc = ["body", *field.split(".")] if field else ["body"]
    return JSONResponse(
        status_code=status,
        content={"detail": [{"loc": loc, "msg": problem, "type": "value_error"}], "field": field},
    )


def _route_env(body: dict[str, Any], enabled: tuple[str, ...]) -> str:
    ref = env_ref(body)
    if ref is None:
        raise InvalidArgument(
            "env",
            "required on POST /verify (or NeMo-Gym's agent_ref.name / task_source); "
            "or use POST /{env}/verify",
        )
    if ref.env not in enabled:
        field, problem = unknown_env_problem(ref, enabled).split(": ", 1)
        raise InvalidArgument(field, problem)
    return ref.env


async def read_body(request: Request, limits: LimitsConfig) -> bytes:
    """The request body, or TooLarge once it passes `limits.max_request_bytes` (judged
    from Content-Length when given; the rest is drained, not kept)."""
    limit = limits.max_request_bytes
    declared = request.headers.get("content-length", "")
    too_large = declared.isdigit() and int(declared) > limit
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            too_large = True
        if too_large:
            chunks.clear()
            if size > _DRAIN_FACTOR * limit:
                break
        else:
            chunks.append(chunk)
    if too_large:
        check_size(max(size, int(declared or 0)), limit, "", "max_request_bytes", "bytes")
    return b"".join(chunks)


def parse_request(raw: bytes, limits: LimitsConfig) -> tuple[dict[str, Any], Sample]:
    """The verify body and its response as a Sample, every field checked against
    `limits` (the row is the body without `response`)."""
    body = loads(raw, "", limits)
    if not isinstance(body, dict):
        raise InvalidArgument("", "request body must be a JSON object")
    check = JsonCheck(limits)
    row_chars = 0
    for key, value in body.items():
        chars = check.check(value, key)
        if key != "response":
            row_chars += len(key) + chars
    if row_chars > limits.max_row_chars:
        raise TooLarge(
            "",
            f"the row fields (all but `response`) hold {row_chars} characters of text, "
            f"exceeding limits.max_row_chars ({limits.max_row_chars})",
        )
    return body, sample_from_response(body.get("response"), check)


async def _has_body(request: Request) -> bool:
    """NeMo-Gym's legacy agents may POST /seed_session with an empty body."""
    declared = request.headers.get("content-length")
    return (
        declared != "0" if declared is not None else bool(request.headers.get("transfer-encoding"))
    )


def _error(exc: InvalidArgument) -> JSONResponse:
    status = 413 if isinstance(exc, TooLarge) else 422
    return _unprocessable(exc.field.removeprefix("row."), exc.message.split(": ", 1)[-1], status)


def add_routes(app: FastAPI, gateway: Gateway) -> None:
    limits = gateway.config.limits
    add_tool_routes(app, gateway)

    async def read_json(request: Request) -> Any:
        body = loads(await read_body(request, limits), "", limits)
        JsonCheck(limits).check(body, "")
        return body

    def check_env(env: str | None) -> str | None:
        """The environment of a `/{env}/...` route (NeMo-Gym server names mapped)."""
        if env is None:
            return None
        env = NEMO_GYM_NAMES.get(env, env)
        gateway.environment(env)  # InvalidArgument naming `env` if not served here
        return env

    async def verify(env: str | None, request: Request) -> JSONResponse:
        label = env or "?"
        try:
            env = check_env(env)
            body, sample = parse_request(await read_body(request, limits), limits)
            env = env or _route_env(body, gateway.enabled)
            label = env
            row = {k: v for k, v in body.items() if k != "response"}
            score = await gateway.score(env, row, sample)
        except InvalidArgument as exc:
            response = _error(exc)
            metrics.HTTP_REQUESTS.labels(
                label if label in gateway.enabled else "?", str(response.status_code)
            ).inc()
            return response
        except Overloaded as exc:
            metrics.HTTP_REQUESTS.labels(label, "429").inc()
            return JSONResponse(
                status_code=429, content={"detail": str(exc)}, headers={"Retry-After": "1"}
            )
        metrics.HTTP_REQUESTS.labels(label, "200").inc()
        return JSONResponse(verify_response(body, score))

    async def seed_session(request: Request) -> Any:
        body = await read_json(request) if await _has_body(request) else {}
        if not isinstance(body, dict):
            raise InvalidArgument("", "request body must be a JSON object")
        session = body.get("resources_session_id")
        if session is None:
            return {}
        if not isinstance(session, str) or not session:
            raise InvalidArgument("resources_session_id", "expected a non-empty string")
        return {"resources_session_id": session}

    async def close_session(request: Request) -> Any:
        body = await read_json(request)
        session = body.get("resources_session_id") if isinstance(body, dict) else None
        if not isinstance(session, str) or not session:
            raise InvalidArgument("resources_session_id", "required: a non-empty string")
        return {"resources_session_id": session}

    async def aggregate(request: Request) -> Any:
        body = await read_json(request)
        # Many responses can take a while; keep the event loop serving /verify.
        return await asyncio.to_thread(aggregate_metrics, body)

    async def reverify_mode(request: Request) -> Any:
        return "stateless"

    async def verify_routed(request: Request) -> JSONResponse:
        return await verify(None, request)

    async def verify_env(request: Request) -> JSONResponse:
        return await verify(request.path_params["env"], request)

    # The hot path, as plain Starlette routes at the front of the table: FastAPI's route
    # (dependency solving for a bare `Request`, response-model handling) cost more per
    # call than the structured-output check itself (issue 28).
    app.router.routes[:0] = [
        Route("/verify", verify_routed, methods=["POST"]),
        Route("/{env}/verify", verify_env, methods=["POST"]),
    ]

    def at_root_and_per_env(method: str, path: str, answer: Answer) -> None:
        """`path` at the root and under `/{env}`, as NeMo-Gym serves it both ways: the
        reply is `answer`'s JSON, or the 422 of an unknown `{env}` or of what it refuses."""

        async def reply(env: str | None, request: Request) -> JSONResponse:
            try:
                check_env(env)
                content = await answer(request)
            except InvalidArgument as exc:
                return _error(exc)
            return JSONResponse(content)

        async def at_root(request: Request) -> JSONResponse:
            return await reply(None, request)

        async def per_env(env: str, request: Request) -> JSONResponse:
            return await reply(env, request)

        name = path.strip("/")
        app.add_api_route(path, at_root, methods=[method], name=f"{name}_root")
        app.add_api_route("/{env}" + path, per_env, methods=[method], name=f"{name}_env")

    at_root_and_per_env("POST", "/seed_session", seed_session)
    at_root_and_per_env("POST", "/close_session", close_session)
    at_root_and_per_env("POST", "/aggregate_metrics", aggregate)
    at_root_and_per_env("GET", "/reverify_mode", reverify_mode)

    @app.get("/environments")
    async def environments() -> list[dict[str, Any]]:
        return [
            {
                "name": e.name,
                "description": e.description,
                "required_fields": list(e.required_fields),
                "optional_fields": list(e.optional_fields),
                "group_aware": e.group_aware,
                "verify_route": f"/{e.name}/verify",
            }
            for e in gateway.environments()
        ]
