"""Request bodies of the OpenAI face. Every field is declared: an unknown one is refused
(HTTP 400 naming it), never silently ignored. A standard OpenAI field the face does not
implement is declared only to refuse a value that would change the answer
(`check_unsupported`); `user`, `metadata`, `store`, `service_tier`, `parallel_tool_calls`
and `stream_options.include_obfuscation` are accepted and ignored.

JSON has no NaN nor infinities, but Python's parser reads `NaN`, `Infinity` and numbers
too large for a double (`1e999`) as such: a body holding one anywhere is refused (400
naming where), before any field is read, so no engine samples with a NaN temperature.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError
from rlfleet_core.errors import InvalidArgument

MAX_TOP_LOGPROBS = 20
"""vLLM's default `max_logprobs`; OpenAI allows 20 for chat."""
NON_FINITE = "non_finite_number"
"""The pydantic error type of a NaN or infinity in a body; its ctx names the field."""


def first_non_finite(value: Any, path: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in a parsed JSON value, else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "body"
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = first_non_finite(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data: Any) -> Any:
        where = first_non_finite(data)
        if where is not None:
            raise PydanticCustomError(
                NON_FINITE,
                "{field}: NaN and infinities are not numbers (send a finite value)",
                {"field": where},
            )
        return data


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool = False


class _Body(_Strict):
    model: str = ""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling parameters.
    top_k: int = -1
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    """Generate max_tokens even past end-of-sequence."""


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] = ""
    logprobs: int | None = Field(default=None)
    """The k most likely tokens per position (0: only the chosen token's logprob)."""
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class ChatBody(_Body):
    messages: list[dict[str, Any]] = []
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    """vLLM's chat extension: open an assistant turn after the messages."""
    continue_final_message: bool = False
    """vLLM's chat extension: the last message is a started assistant answer (a prefill)
    that the model continues; needs `add_generation_prompt: false`."""


class ResponsesBody(_Strict):
    model: str = ""
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None


class TokenizeBody(_Strict):
    """vLLM's POST /tokenize: exactly one of `prompt` and `messages`."""

    model: str = ""
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None
    """Default: true for a prompt, false for messages (the template adds them)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class DetokenizeBody(_Strict):
    model: str = ""
    tokens: list[int]


def tool_choice_on(tools: list[dict[str, Any]] | None, choice: Any) -> bool:
    """Whether calls are parsed: tools given and tool_choice auto (the default) or none."""
    if choice not in (None, "auto", "none"):
        raise InvalidArgument(
            "tool_choice", f"only 'auto' and 'none' are supported, got {choice!r}"
        )
    for i, tool in enumerate(tools or []):
        if tool.get("type", "function") != "function":
            raise InvalidArgument(f"tools[{i}].type", "only function tools are supported")
    return bool(tools) and choice != "none"


def check_unsupported(body: BaseModel) -> None:
    """Refuse a standard field whose value this face would not honour."""
    b: Any = body
    if getattr(b, "frequency_penalty", 0.0) or getattr(b, "presence_penalty", 0.0):
        field = "frequency_penalty" if b.frequency_penalty else "presence_penalty"
        raise InvalidArgument(field, "is not supported (use repetition_penalty)")
    if getattr(b, "logit_bias", None):
        raise InvalidArgument("logit_bias", "is not supported")
    fmt = getattr(b, "response_format", None)
    if fmt and fmt.get("type", "text") != "text":
        raise InvalidArgument("response_format", "only {'type': 'text'} is supported")
    text = getattr(b, "text", None)
    if text and (text.get("format") or {}).get("type", "text") != "text":
        raise InvalidArgument("text.format", "only {'type': 'text'} is supported")
    if getattr(b, "previous_response_id", None):
        raise InvalidArgument("previous_response_id", "is not supported: responses are not stored")
    if getattr(b, "echo", False):
        raise InvalidArgument("echo", "is not supported")
    if getattr(b, "suffix", None):
        raise InvalidArgument("suffix", "is not supported")
    if getattr(b, "best_of", None) not in (None, 1):
        raise InvalidArgument("best_of", "is not supported (use n)")
    for name in ("top_logprobs", "logprobs"):
        k = getattr(b, name, None)
        if isinstance(k, int) and not isinstance(k, bool) and not 0 <= k <= MAX_TOP_LOGPROBS:
            raise InvalidArgument(name, f"must be within [0, {MAX_TOP_LOGPROBS}], got {k}")
    if getattr(b, "top_logprobs", None) and not getattr(b, "logprobs", False):
        raise InvalidArgument("top_logprobs", "needs logprobs: true")
