"""NeMo-Gym-compatible HTTP face: `POST /{env}/verify` (one route per environment, like
one NeMo-Gym resources server each) and `POST /verify` routing on `env` / `agent_ref.name`.

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

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from rlfleet_core.errors import InvalidArgument

from rlfleet_reward import metrics
from rlfleet_reward.config import LimitsConfig
from rlfleet_reward.environments.tool_use import decode_arguments
from rlfleet_reward.gateway import Gateway
from rlfleet_reward.limits import JsonCheck, NotJson, TooLarge, check_size, loads
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


def _route_env(body: dict[str, Any]) -> str:
    env = body.get("env")
    if isinstance(env, str) and env:
        return env
    agent_ref = body.get("agent_ref")
    if isinstance(agent_ref, dict) and isinstance(agent_ref.get("name"), str) and agent_ref["name"]:
        return str(agent_ref["name"])
    raise InvalidArgument(
        "env", "required on POST /verify (or agent_ref.name); or use POST /{env}/verify"
    )


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


def add_routes(app: FastAPI, gateway: Gateway) -> None:
    limits = gateway.config.limits
    add_tool_routes(app, gateway)

    async def verify(env: str | None, request: Request) -> JSONResponse:
        label = env or "?"
        try:
            body, sample = parse_request(await read_body(request, limits), limits)
            env = env or _route_env(body)
            label = env if env in gateway.enabled else "?"
            row = {k: v for k, v in body.items() if k != "response"}
            score = await gateway.score(env, row, sample)
        except InvalidArgument as exc:
            status = 413 if isinstance(exc, TooLarge) else 422
            metrics.HTTP_REQUESTS.labels(label, str(status)).inc()
            field = exc.field.removeprefix("row.")
            return _unprocessable(field, exc.message.split(": ", 1)[-1], status)
        except Overloaded as exc:
            metrics.HTTP_REQUESTS.labels(label, "429").inc()
            return JSONResponse(
                status_code=429, content={"detail": str(exc)}, headers={"Retry-After": "1"}
            )
        metrics.HTTP_REQUESTS.labels(label, "200").inc()
        return JSONResponse(verify_response(body, score))

    @app.post("/verify")
    async def verify_routed(request: Request) -> JSONResponse:
        return await verify(None, request)

    @app.post("/{env}/verify")
    async def verify_env(env: str, request: Request) -> JSONResponse:
        return await verify(env, request)

    @app.post("/{env}/seed_session")
    async def seed_session(env: str) -> JSONResponse:
        # Verifiable environments keep no per-episode state; NeMo-Gym agents still call this.
        if env not in gateway.enabled:
            return _unprocessable("env", f"unknown environment {env!r}")
        return JSONResponse({})

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
