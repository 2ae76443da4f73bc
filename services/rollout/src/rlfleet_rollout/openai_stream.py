"""Server-sent events (`stream: true`) for the OpenAI face, in OpenAI's chunk formats.

The engines yield finished samples only (`Engine.generate`), so a stream is built from the
finished answer: each choice's text comes as one delta, once the request's samples are done.
Clients that read streams work unchanged; time to first token is the whole generation time
(docs/rollout.md, "Streaming").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi.responses import StreamingResponse

_TRAINING_FIELDS = (
    "prompt_token_ids",
    "generation_token_ids",
    "generation_log_probs",
    "weight_version_first",
    "weight_version_last",
)


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def response(kind: str, result: dict[str, Any], body: Any) -> StreamingResponse:
    events = {"chat": _chat, "completions": _completions, "responses": _responses}[kind]
    return StreamingResponse(events(result, body), media_type="text/event-stream")


def _include_usage(body: Any) -> bool:
    options = getattr(body, "stream_options", None)
    return bool(options and options.include_usage)


def _chat(result: dict[str, Any], body: Any) -> Iterator[str]:
    usage = _include_usage(body)
    head = {k: result[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        choice.update(extra)
        return _data({**head, "choices": [choice], **({"usage": None} if usage else {})})

    for choice in result["choices"]:
        i, message = choice["index"], choice["message"]
        yield chunk(i, {"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk(i, {"content": message["content"]}, logprobs=choice["logprobs"])
        elif choice["logprobs"] is not None:
            yield chunk(i, {}, logprobs=choice["logprobs"])
        for n, call in enumerate(message.get("tool_calls") or []):
            yield chunk(i, {"tool_calls": [{"index": n, **call}]})
        training = {k: message[k] for k in _TRAINING_FIELDS}
        yield chunk(i, {}, finish_reason=choice["finish_reason"], **training)
    if usage:
        yield _data({**head, "choices": [], "usage": result["usage"]})
    yield "data: [DONE]\n\n"


def _completions(result: dict[str, Any], body: Any) -> Iterator[str]:
    usage = _include_usage(body)
    head = {k: result[k] for k in ("id", "object", "created", "model")}
    for choice in result["choices"]:
        yield _data(
            {**head, "choices": [{**choice, "finish_reason": None, "logprobs": None}]}
            | ({"usage": None} if usage else {})
        )
        done = {"index": choice["index"], "text": "", "logprobs": None}
        done |= {"finish_reason": choice["finish_reason"]}
        if choice["logprobs"] is not None:  # the whole choice's logprobs, with its text
            done["logprobs"] = choice["logprobs"]
        yield _data({**head, "choices": [done]} | ({"usage": None} if usage else {}))
    if usage:
        yield _data({**head, "choices": [], "usage": result["usage"]})
    yield "data: [DONE]\n\n"


def _responses(result: dict[str, Any], body: Any) -> Iterator[str]:
    seq = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        payload = {"type": kind, "sequence_number": seq - 1, **fields}
        return f"event: {kind}\n" + _data(payload)

    started = {**result, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for out_i, item in enumerate(result["output"]):
        if item["type"] == "message":
            opened = {**item, "status": "in_progress", "content": []}
            yield event("response.output_item.added", output_index=out_i, item=opened)
            for c_i, part in enumerate(item["content"]):
                where = {"item_id": item["id"], "output_index": out_i, "content_index": c_i}
                empty = {**part, "text": ""}
                yield event("response.content_part.added", **where, part=empty)
                if part["text"]:
                    yield event(
                        "response.output_text.delta", **where, delta=part["text"], logprobs=[]
                    )
                yield event("response.output_text.done", **where, text=part["text"], logprobs=[])
                yield event("response.content_part.done", **where, part=part)
        else:  # function_call
            opened = {**item, "status": "in_progress", "arguments": ""}
            yield event("response.output_item.added", output_index=out_i, item=opened)
            where = {"item_id": item["id"], "output_index": out_i}
            yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done",
                **where,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield event("response.output_item.done", output_index=out_i, item=item)
    final = "response.incomplete" if result["status"] == "incomplete" else "response.completed"
    yield event(final, response=result)
