"""The OpenAI-compatible HTTP face: /v1/models, /v1/completions, /v1/chat/completions,
/v1/responses, over the same `Engine` as the gRPC face.

Text is tokenized here, once, with the model's own tokenizer and chat template; engines
only see token ids. Like NeMo-Gym's model server, each choice (chat: the message;
responses: the output message item) also carries `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs`, so an agent's trajectory can be
trained on without re-tokenizing. Streaming is in `openai_stream`, the request bodies
(every field declared; unknown ones refused) in `openai_bodies`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from rlfleet_core.errors import InvalidArgument, ServiceError

from rlfleet_rollout import metrics, openai_stream
from rlfleet_rollout.engines.base import Engine
from rlfleet_rollout.openai_bodies import (
    NON_FINITE,
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    ResponsesBody,
    TokenizeBody,
    check_unsupported,
    tool_choice_on,
)
from rlfleet_rollout.openai_messages import (
    chat_tool,
    response_messages,
    template_message,
    tool_calls,
    training_fields,
    usage_of,
)
from rlfleet_rollout.types import FinishReason, GenerateInput, Sample
from rlfleet_rollout.validation import check_prompt, checked_sampling


def _error(
    status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": param, "code": None}},
    )


class OpenAIFace:
    def __init__(
        self, engine: Engine, tokenizer: Any, model_id: str, aliases: tuple[str, ...]
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.names = {model_id, *aliases}
        self.created = int(time.time())

    # ------------------------------------------------------------------ helpers

    def _check_model(self, name: str) -> None:
        if name and name not in self.names:
            raise _ModelNotFound(name)

    def _chat_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        if not messages:
            raise InvalidArgument("messages", "must not be empty")
        plain = [template_message(m) for m in messages]
        if continue_final_message:
            if add_generation_prompt:
                raise InvalidArgument(
                    "continue_final_message", "needs add_generation_prompt: false"
                )
            if plain[-1]["role"] != "assistant":
                raise InvalidArgument(
                    "continue_final_message",
                    f"the last message must be the assistant's, not {plain[-1]['role']!r}",
                )
        ids = self.tokenizer.apply_chat_template(
            plain,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=True,
            tools=tools or None,
        )
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    async def _run(
        self, ids: list[int], body: Any, max_tokens: int | None, n: int, top: int = 0
    ) -> list[Sample]:
        check_unsupported(body)
        check_prompt(ids, self.engine.vocab_size, self.engine.max_model_len, "prompt")
        room = self.engine.max_model_len - len(ids)
        if max_tokens is not None and max_tokens <= 0:
            raise InvalidArgument("max_tokens", f"must be > 0, got {max_tokens}")
        if not 1 <= n <= 128:
            raise InvalidArgument("n", f"must be within [1, 128], got {n}")
        stop = getattr(body, "stop", None)
        stop_ids = tuple(getattr(body, "stop_token_ids", None) or ())
        if stop_ids:
            check_prompt(list(stop_ids), self.engine.vocab_size, 1 << 30, "stop_token_ids")
        # The same checks as the gRPC face's (NaN, infinities, ranges), naming the field.
        sampling = checked_sampling(
            "",
            max_tokens=min(max_tokens or room, room),
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=getattr(body, "top_k", -1),
            min_tokens=getattr(body, "min_tokens", 0),
            repetition_penalty=getattr(body, "repetition_penalty", 1.0),
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            stop_token_ids=stop_ids,
            ignore_eos=bool(getattr(body, "ignore_eos", False)),
            seed=getattr(body, "seed", None),
            top_logprobs=top,
        )
        request = GenerateInput(
            request_id=f"http-{uuid.uuid4().hex[:16]}",
            prompt_token_ids=tuple(ids),
            n=n,
            sampling=sampling,
            return_text=True,
        )
        samples = [s async for s in self.engine.generate(request)]
        for sample in samples:
            metrics.record_sample(sample, "http")
        return sorted(samples, key=lambda s: s.index)

    def _piece(self, token: int) -> str:
        return str(self.tokenizer.decode([token]))

    def _tokens_logprobs(self, sample: Sample) -> list[dict[str, Any]]:
        out = []
        tops = sample.top_logprobs or [[] for _ in sample.token_ids]
        for token, logprob, top in zip(sample.token_ids, sample.logprobs, tops, strict=True):
            piece = self._piece(token)
            alternatives = []
            for t, lp in top:
                alt = self._piece(t)
                alternatives.append({"token": alt, "logprob": lp, "bytes": list(alt.encode())})
            out.append(
                {
                    "token": piece,
                    "logprob": logprob,
                    "bytes": list(piece.encode()),
                    "top_logprobs": alternatives,
                }
            )
        return out

    # ------------------------------------------------------------------ routes

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model_id,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "rlfleet",
                    "max_model_len": self.engine.max_model_len,
                }
            ],
        }

    async def completions(self, body: CompletionBody) -> dict[str, Any]:
        self._check_model(body.model)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise InvalidArgument(
                    "prompt", "one prompt per request (use n for several samples)"
                )
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=False)]
        else:
            ids = [int(i) for i in prompt]
        samples = await self._run(
            ids,
            body,
            body.max_tokens if body.max_tokens is not None else 16,
            body.n,
            top=body.logprobs or 0,
        )
        choices = []
        for s in samples:
            logprobs = None
            if body.logprobs is not None:
                entries = self._tokens_logprobs(s)
                offsets, at = [], 0
                for e in entries:
                    offsets.append(at)
                    at += len(e["token"])
                logprobs = {
                    "tokens": [e["token"] for e in entries],
                    "token_logprobs": s.logprobs,
                    "top_logprobs": [
                        {a["token"]: a["logprob"] for a in e["top_logprobs"]} for e in entries
                    ]
                    if body.logprobs
                    else None,
                    "text_offset": offsets,
                }
            choices.append(
                {
                    "index": s.index,
                    "text": s.text,
                    "finish_reason": s.finish_reason.value,
                    "logprobs": logprobs,
                    **training_fields(s),
                }
            )
        return self._choices_reply("cmpl", "text_completion", choices, samples)

    def _choices_reply(
        self, id_prefix: str, kind: str, choices: list[dict[str, Any]], samples: list[Sample]
    ) -> dict[str, Any]:
        """The body of a (chat) completion: its choices, with id, time, model and usage."""
        return {
            "id": f"{id_prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
            "usage": usage_of(samples),
        }

    async def chat(self, body: ChatBody) -> dict[str, Any]:
        self._check_model(body.model)
        parse_tools = tool_choice_on(body.tools, body.tool_choice)
        ids = self._chat_ids(
            body.messages, body.tools, body.add_generation_prompt, body.continue_final_message
        )
        top = (body.top_logprobs or 0) if body.logprobs else 0
        samples = await self._run(
            ids, body, body.max_completion_tokens or body.max_tokens, body.n, top
        )
        choices = []
        for s in samples:
            content, calls = tool_calls(s.text) if parse_tools else (s.text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            message.update(training_fields(s))
            finish = s.finish_reason.value
            if calls and s.finish_reason == FinishReason.STOP:
                finish = "tool_calls"
            choices.append(
                {
                    "index": s.index,
                    "message": message,
                    "finish_reason": finish,
                    "logprobs": {"content": self._tokens_logprobs(s)} if body.logprobs else None,
                }
            )
        return self._choices_reply("chatcmpl", "chat.completion", choices, samples)

    async def responses(self, body: ResponsesBody) -> dict[str, Any]:
        self._check_model(body.model)
        parse_tools = tool_choice_on(body.tools, body.tool_choice)
        tools = [chat_tool(t) for t in body.tools or []]
        ids = self._chat_ids(response_messages(body), tools)
        (sample,) = await self._run(ids, body, body.max_output_tokens, 1)
        truncated = sample.finish_reason == FinishReason.LENGTH
        content, calls = tool_calls(sample.text) if parse_tools else (sample.text, [])
        output: list[dict[str, Any]] = []
        if content is not None or not calls:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{uuid.uuid4().hex}",
                    "role": "assistant",
                    "status": "incomplete" if truncated else "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "text": content or "",
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                }
            )
        for call in calls:
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{uuid.uuid4().hex}",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                    "status": "completed",
                }
            )
        output[-1].update(training_fields(sample))
        usage = usage_of([sample])
        return {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": self.model_id,
            "status": "incomplete" if truncated else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "error": None,
            "instructions": body.instructions,
            "metadata": body.metadata or {},
            "output": output,
            "parallel_tool_calls": bool(body.parallel_tool_calls),
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "max_output_tokens": body.max_output_tokens,
            "usage": {
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    async def tokenize(self, body: TokenizeBody) -> dict[str, Any]:
        self._check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise InvalidArgument("prompt", "give exactly one of prompt and messages")
        if body.messages is not None:
            ids = self._chat_ids(
                body.messages, body.tools, body.add_generation_prompt, body.continue_final_message
            )
            if body.add_special_tokens and self.tokenizer.bos_token_id is not None:
                ids = [int(self.tokenizer.bos_token_id), *ids]
        else:
            special = True if body.add_special_tokens is None else body.add_special_tokens
            ids = [int(i) for i in self.tokenizer.encode(body.prompt, add_special_tokens=special)]
        return {
            "count": len(ids),
            "max_model_len": self.engine.max_model_len,
            "tokens": ids,
            "token_strs": self.tokenizer.convert_ids_to_tokens(ids)
            if body.return_token_strs
            else None,
        }

    async def detokenize(self, body: DetokenizeBody) -> dict[str, Any]:
        self._check_model(body.model)
        check_prompt(body.tokens, self.engine.vocab_size, 1 << 30, "tokens")
        return {"prompt": self.tokenizer.decode(body.tokens)}


_HTTP_STATUS = {"FAILED_PRECONDITION": 409, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503}


class _ModelNotFound(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def add_openai_routes(app: FastAPI, face_getter: Any) -> None:
    """Register the /v1 routes and /tokenize, /detokenize; `face_getter()` returns the
    OpenAIFace once the engine has started (None before: 503)."""

    async def call(fn_name: str, body: Any = None) -> Any:
        face = face_getter()
        if face is None:
            return _error(503, "the engine is still loading", kind="service_unavailable")
        try:
            fn = getattr(face, fn_name)
            result = await fn(body) if body is not None else fn()
        except InvalidArgument as exc:
            return _error(400, exc.message, param=exc.field)
        except _ModelNotFound as exc:
            return _error(
                404,
                f"The model `{exc.name}` does not exist; served: {face.model_id}",
                param="model",
                kind="model_not_found",
            )
        except ServiceError as exc:
            status = _HTTP_STATUS.get(exc.code.name, 500)
            return _error(status, exc.message, kind=exc.code.name.lower())
        if body is not None and getattr(body, "stream", False):
            return openai_stream.response(fn_name, result, body)
        return result

    @app.get("/v1/models")
    async def list_models() -> Any:
        return await call("models")

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> Any:
        return await call("completions", body)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody) -> Any:
        return await call("chat", body)

    @app.post("/v1/responses")
    async def responses(body: ResponsesBody) -> Any:
        return await call("responses", body)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeBody) -> Any:
        return await call("tokenize", body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeBody) -> Any:
        return await call("detokenize", body)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        # OpenAI and vLLM answer a malformed body with 400 naming the field (FastAPI: 422).
        first = exc.errors()[0]
        if first.get("type") == NON_FINITE:  # found anywhere in the body: ctx says where
            field = str(first["ctx"]["field"])
            return _error(400, str(first.get("msg")), param=field)
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "body"
        if first.get("type") == "extra_forbidden":
            return _error(400, f"{field}: unknown or unsupported field", param=field)
        return _error(400, f"{field}: {first.get('msg', 'invalid')}", param=field)

    @app.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        return _error(400, str(exc))
