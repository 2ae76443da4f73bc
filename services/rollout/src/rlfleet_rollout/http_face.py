"""The OpenAI-compatible HTTP face: /v1/models, /v1/completions, /v1/chat/completions,
/v1/responses, over the same `Engine` as the gRPC face.

Text is tokenized here, once, with the model's own tokenizer and chat template; engines
only see token ids. Like NeMo-Gym's model server, each choice (chat: the message;
responses: the output message item) also carries `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs`, so an agent's trajectory can be
trained on without re-tokenizing. Streaming (`stream: true`) is not offered.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from rlfleet_core.errors import InvalidArgument, ServiceError

from rlfleet_rollout import metrics
from rlfleet_rollout.engines.base import Engine
from rlfleet_rollout.types import FinishReason, GenerateInput, Sample, SamplingConfig
from rlfleet_rollout.validation import check_prompt


class _Body(BaseModel):
    # Unknown OpenAI fields (user, metadata, ...) are accepted and ignored.
    model_config = ConfigDict(extra="allow")

    model: str = ""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    ignore_eos: bool = False
    """vLLM's extra sampling parameter: generate max_tokens even past end-of-sequence."""


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] = ""
    logprobs: int | None = None


class ChatBody(_Body):
    messages: list[dict[str, Any]] = []
    max_completion_tokens: int | None = None
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    """vLLM's chat extension: open an assistant turn after the messages."""
    continue_final_message: bool = False
    """vLLM's chat extension: the last message is a started assistant answer (a prefill)
    that the model continues; needs `add_generation_prompt: false`."""


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    tools: list[dict[str, Any]] | None = None
    stream: bool = False


def _error(
    status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "param": param, "code": None}},
    )


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
            parts.append(str(part.get("text", "")))
    return "".join(parts)


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
        plain = [
            {"role": str(m.get("role", "user")), "content": _text(m.get("content"))}
            for m in messages
        ]
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

    async def _run(self, ids: list[int], body: Any, max_tokens: int | None, n: int) -> list[Sample]:
        check_prompt(ids, self.engine.vocab_size, self.engine.max_model_len, "prompt")
        room = self.engine.max_model_len - len(ids)
        if max_tokens is not None and max_tokens <= 0:
            raise InvalidArgument("max_tokens", f"must be > 0, got {max_tokens}")
        if not 1 <= n <= 128:
            raise InvalidArgument("n", f"must be within [1, 128], got {n}")
        if body.temperature < 0:
            raise InvalidArgument("temperature", f"must be >= 0, got {body.temperature}")
        stop = getattr(body, "stop", None)
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        sampling = SamplingConfig(
            max_tokens=min(max_tokens or room, room),
            temperature=body.temperature,
            top_p=body.top_p if 0 < body.top_p <= 1 else 1.0,
            top_k=getattr(body, "top_k", -1),
            stop=stops,
            seed=getattr(body, "seed", None),
            ignore_eos=bool(getattr(body, "ignore_eos", False)),
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

    def _tokens_logprobs(self, sample: Sample) -> list[dict[str, Any]]:
        out = []
        for token, logprob in zip(sample.token_ids, sample.logprobs, strict=True):
            piece = self.tokenizer.decode([token])
            out.append(
                {
                    "token": piece,
                    "logprob": logprob,
                    "bytes": list(piece.encode()),
                    "top_logprobs": [],
                }
            )
        return out

    @staticmethod
    def _usage(samples: list[Sample]) -> dict[str, int]:
        prompt = len(samples[0].prompt_token_ids) if samples else 0
        completion = sum(len(s.token_ids) for s in samples)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    @staticmethod
    def _training_fields(sample: Sample) -> dict[str, Any]:
        return {
            "prompt_token_ids": list(sample.prompt_token_ids),
            "generation_token_ids": list(sample.token_ids),
            "generation_log_probs": list(sample.logprobs),
            "weight_version_first": sample.weight_version_first,
            "weight_version_last": sample.weight_version_last,
        }

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
            ids, body, body.max_tokens if body.max_tokens is not None else 16, body.n
        )
        choices = []
        for s in samples:
            logprobs = None
            if body.logprobs is not None:
                pieces = [self.tokenizer.decode([t]) for t in s.token_ids]
                logprobs = {
                    "tokens": pieces,
                    "token_logprobs": s.logprobs,
                    "top_logprobs": None,
                    "text_offset": [],
                }
            choices.append(
                {
                    "index": s.index,
                    "text": s.text,
                    "finish_reason": s.finish_reason.value,
                    "logprobs": logprobs,
                    **self._training_fields(s),
                }
            )
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
            "usage": self._usage(samples),
        }

    async def chat(self, body: ChatBody) -> dict[str, Any]:
        self._check_model(body.model)
        ids = self._chat_ids(
            body.messages, body.tools, body.add_generation_prompt, body.continue_final_message
        )
        samples = await self._run(ids, body, body.max_completion_tokens or body.max_tokens, body.n)
        choices = []
        for s in samples:
            message = {"role": "assistant", "content": s.text, **self._training_fields(s)}
            choices.append(
                {
                    "index": s.index,
                    "message": message,
                    "finish_reason": s.finish_reason.value,
                    "logprobs": {"content": self._tokens_logprobs(s)} if body.logprobs else None,
                }
            )
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_id,
            "choices": choices,
            "usage": self._usage(samples),
        }

    async def responses(self, body: ResponsesBody) -> dict[str, Any]:
        self._check_model(body.model)
        messages: list[dict[str, Any]] = []
        if body.instructions:
            messages.append({"role": "system", "content": body.instructions})
        if isinstance(body.input, str):
            messages.append({"role": "user", "content": body.input})
        else:
            for item in body.input:
                if item.get("type", "message") == "message" and "role" in item:
                    messages.append({"role": item["role"], "content": _text(item.get("content"))})
                elif item.get("type") == "function_call_output":
                    messages.append({"role": "tool", "content": str(item.get("output", ""))})
        ids = self._chat_ids(messages, body.tools)
        (sample,) = await self._run(ids, body, body.max_output_tokens, 1)
        truncated = sample.finish_reason == FinishReason.LENGTH
        item = {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex}",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": sample.text, "annotations": [], "logprobs": []}
            ],
            **self._training_fields(sample),
        }
        usage = self._usage([sample])
        return {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": self.model_id,
            "status": "incomplete" if truncated else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
            "error": None,
            "instructions": body.instructions,
            "metadata": {},
            "output": [item],
            "parallel_tool_calls": False,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tool_choice": "auto",
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


_HTTP_STATUS = {"FAILED_PRECONDITION": 409, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503}


class _ModelNotFound(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def add_openai_routes(app: FastAPI, face_getter: Any) -> None:
    """Register the /v1 routes; `face_getter()` returns the OpenAIFace once the engine
    has started (None before: 503)."""

    async def call(fn_name: str, body: Any = None) -> Any:
        face = face_getter()
        if face is None:
            return _error(503, "the engine is still loading", kind="service_unavailable")
        if body is not None and getattr(body, "stream", False):
            return _error(400, "stream=true is not supported; send stream=false", param="stream")
        try:
            fn = getattr(face, fn_name)
            return await fn(body) if body is not None else fn()
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

    @app.exception_handler(ValueError)
    async def value_error(request: Request, exc: ValueError) -> JSONResponse:
        return _error(400, str(exc))
