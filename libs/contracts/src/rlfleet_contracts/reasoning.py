"""Reasoning control: what a row asks of the chat template and of generation length, the
low-effort form of a row, and the recipe's `reasoning` section (template defaults and the
low-effort schedule).

Row fields read here (all under `responses_create_params`):
- `chat_template_kwargs`, then NeMo-Gym's per-sample `metadata.chat_template_kwargs` (a JSON
  string) over it: passed to the tokenizer's chat template (Nemotron 3 reads
  `enable_thinking`, `low_effort`, `truncate_history_thinking`, `reasoning_budget`).
- `max_output_tokens` (Responses API), or the chat-completions spellings `max_tokens` /
  `max_completion_tokens`: a cap on this prompt's generated tokens (the least one wins).

Low effort (Nemotron 3 Super RLVR): a prompt in low-effort mode is scored by the
`low_effort` environment wrapping its own (correctness discounted by generated tokens)
and templated with reasoning on and the template's low-effort switch set.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, field_validator, model_validator
from rlfleet_core.config import ConfigModel

from rlfleet_contracts.rows import DataError, Row, env_of

LOW_EFFORT_ENV = "low_effort"

TemplateValue = bool | int | float | str
"""What a chat-template switch may be set to from a recipe."""

LOW_EFFORT_TEMPLATE_KWARGS: dict[str, TemplateValue] = {"enable_thinking": True, "low_effort": True}
"""Nemotron 3's switches for low-effort reasoning (its chat template reads both)."""

MAX_TOKENS_FIELDS = ("max_output_tokens", "max_tokens", "max_completion_tokens")

# apply_chat_template's own arguments: a row must not set them through the template kwargs.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def _params(row: Row) -> dict[str, Any]:
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        raise DataError("responses_create_params: missing or not an object")
    return params


def row_template_kwargs(row: Row) -> dict[str, Any]:
    """The row's template switches ({} when none): `chat_template_kwargs`, overlaid by
    NeMo-Gym's per-sample `metadata.chat_template_kwargs` (a JSON string, as its vllm_model
    server reads it). A non-object or a key that is one of apply_chat_template's own
    arguments is a `DataError` naming the field."""
    params = _params(row)
    kwargs = _switches(params.get("chat_template_kwargs"), "chat_template_kwargs")
    metadata = params.get("metadata")
    if isinstance(metadata, dict) and metadata.get("chat_template_kwargs") is not None:
        raw = metadata["chat_template_kwargs"]
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"responses_create_params.metadata.chat_template_kwargs: invalid JSON ({exc})"
                ) from None
        kwargs.update(_switches(raw, "metadata.chat_template_kwargs"))
    return kwargs


def _switches(kwargs: Any, field: str) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise DataError(
            f"responses_create_params.{field}: expected an object, got {type(kwargs).__name__}"
        )
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if reserved:
        raise DataError(
            f"responses_create_params.{field}.{reserved[0]}: is an argument of "
            "apply_chat_template itself, not a template switch; remove it"
        )
    return dict(kwargs)


def row_max_output_tokens(row: Row) -> int | None:
    """The row's cap on generated tokens (None when it sets none); the least of the
    fields present. A value that is not a positive integer is a `DataError`."""
    params = _params(row)
    caps = []
    for name in MAX_TOKENS_FIELDS:
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(
                f"responses_create_params.{name}: expected a positive integer, got {value!r}"
            )
        caps.append(value)
    return min(caps) if caps else None


def with_template_kwargs(row: Row, updates: dict[str, Any]) -> Row:
    """The row with `updates` over its template switches, all of them in
    `chat_template_kwargs` (a per-sample `metadata.chat_template_kwargs` is folded in and
    removed, so it cannot override `updates`)."""
    params = dict(_params(row))
    params["chat_template_kwargs"] = {**row_template_kwargs(row), **updates}
    metadata = params.get("metadata")
    if isinstance(metadata, dict) and "chat_template_kwargs" in metadata:
        params["metadata"] = {k: v for k, v in metadata.items() if k != "chat_template_kwargs"}
    return {**row, "responses_create_params": params}


def to_low_effort(
    row: Row,
    token_budget: int,
    template_kwargs: dict[str, Any],
    length_penalty: float | None = None,
    inner_env: str | None = None,
) -> Row:
    """The row in low-effort mode: scored by `low_effort` wrapping its environment
    (`inner_env`, default the row's own) with budget `token_budget` (and λ =
    `length_penalty` when given, else the environment's default), templated with
    `template_kwargs` over its own. A row already in low-effort mode comes back unchanged."""
    inner = inner_env or env_of(row)
    if inner == LOW_EFFORT_ENV:
        return row
    converted = {
        **with_template_kwargs(row, template_kwargs),
        "env": LOW_EFFORT_ENV,
        "inner_env": inner,
        "token_budget": token_budget,
    }
    if length_penalty is not None:
        converted["length_penalty"] = length_penalty
    return converted


def _no_reserved_kwargs(kwargs: dict[str, TemplateValue]) -> dict[str, TemplateValue]:
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if reserved:
        raise ValueError(
            f"{reserved[0]!r} is an argument of apply_chat_template itself, not a template "
            "switch; remove it"
        )
    return kwargs


class LowEffortPhase(ConfigModel):
    """One phase of the low-effort schedule: from `from_step` until the next phase."""

    from_step: int = Field(1, ge=1)
    """First optimizer step of the phase (steps count from 1). A prompt belongs to step
    ⌊index / grpo.num_prompts_per_step⌋ + 1 of its position in the prompt stream."""
    fraction: float = Field(ge=0, le=1)
    """Share of *all* training prompts of the phase put in low-effort mode (Super: 0.02
    early, 0.01 late). Only rows of `envs` are converted, each with probability
    fraction / (their share of the rows), so the share of all prompts is `fraction`."""
    envs: list[str] = Field(default_factory=list)
    """Environments whose rows may be converted (Super early: math, STEM QA, competitive
    coding; late: math, STEM QA); empty = every environment."""


class LowEffortConfig(ConfigModel):
    """The low-effort schedule (Nemotron 3 Super RLVR), applied as prompts are issued."""

    phases: list[LowEffortPhase] = Field(default_factory=list)
    """Phases in increasing `from_step`; none = no prompt is put in low-effort mode by the
    trainer (rows data prep converted stay as they are)."""
    token_budget: int = Field(2048, ge=1)
    """B of the `low_effort` environment: generated tokens at which a correct answer's
    discount is full. Not published for Super; 2048 is the environment's default."""
    length_penalty: float | None = Field(None, ge=0, le=1)
    """λ of the `low_effort` environment (the largest discount); None = its default 0.5."""
    chat_template_kwargs: dict[str, TemplateValue] = Field(
        default_factory=lambda: dict(LOW_EFFORT_TEMPLATE_KWARGS)
    )
    """Template switches of a low-effort prompt, over the row's own (Nemotron 3's chat
    template reads `low_effort`; templates that do not read a switch ignore it)."""

    _no_reserved = field_validator("chat_template_kwargs")(_no_reserved_kwargs)

    @model_validator(mode="after")
    def _phases_in_order(self) -> LowEffortConfig:
        starts = [p.from_step for p in self.phases]
        if starts != sorted(set(starts)):
            raise ValueError(
                f"phases: from_step values {starts} must increase strictly; list the phases "
                "in the order they start"
            )
        return self


class ReasoningConfig(ConfigModel):
    """Reasoning control: chat-template switches for every prompt and the low-effort
    schedule. A row's own `responses_create_params.chat_template_kwargs` win over
    `chat_template_kwargs` here, key by key."""

    chat_template_kwargs: dict[str, TemplateValue] = Field(default_factory=dict)
    """Switches passed to the chat template for every prompt unless the row sets them,
    e.g. `enable_thinking: false` for a reasoning-off stage."""
    low_effort: LowEffortConfig = LowEffortConfig()

    _no_reserved = field_validator("chat_template_kwargs")(_no_reserved_kwargs)
