"""Preference learning (DPO): the `dpo` recipe section and the preference-pair row.

A pair row (JSONL, one per line) is TRL's conversational preference format plus tools:

    {"prompt":   [{"role": "system", ...}, {"role": "user", "content": "..."}],
     "tools":    [{"type": "function", "function": {"name": ..., "parameters": {...}}}],
     "chosen":   [{"role": "assistant", "content": "..."}],
     "rejected": [{"role": "assistant", "content": "..."}],
     "metadata": {"source": "...", ...}}

`tools` and `metadata` are optional; `chosen` / `rejected` may be a plain string (one
assistant message). `parse_preference_pair` checks a row and names the field at fault;
`read_preference_pairs` reads a JSONL file (or folder) of them, errors naming file:line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rlfleet_core.config import ConfigModel

from rlfleet_contracts.rows import DataError, read_blend

DPOLossType = Literal["sigmoid", "ipo", "simpo"]
DPO_LOSS_TYPES: tuple[str, ...] = ("sigmoid", "ipo", "simpo")


class DPOConfig(ConfigModel):
    """Direct preference optimisation (Rafailov et al. 2023) and two variants."""

    beta: float = Field(0.1, gt=0)
    """Inverse temperature of the implicit reward β·log(π/π_ref) (sigmoid, IPO: the
    regulariser, target margin 1/(2β); SimPO: the reward scale, its paper uses 2.0-10)."""
    loss_type: DPOLossType = "sigmoid"
    """`sigmoid` = DPO; `ipo` = Azar et al. 2023, squared loss to the margin 1/(2β);
    `simpo` = Meng et al. 2024, length-averaged logprobs, no reference, margin γ."""
    label_smoothing: float = Field(0.0, ge=0, lt=0.5)
    """ε: the chance a label is flipped (conservative DPO / SimPO): loss =
    −(1−ε)·log σ(z) − ε·log σ(−z). IPO has no label smoothing (must be 0)."""
    simpo_gamma: float = Field(0.5, ge=0)
    """SimPO's target reward margin γ (loss_type=simpo only)."""
    reference: Literal["precomputed", "copy", "none"] = "precomputed"
    """Where log π_ref comes from: `precomputed` = scored once per pair by the starting
    weights before the first step (no second model in memory); `copy` = a frozen copy of
    the starting weights scores every step's pairs; `none` = reference-free (log π_ref = 0;
    SimPO is always reference-free)."""
    lr: float = Field(5e-7, gt=0, lt=1)
    """Learning rate of the DPO stage (DPO papers use 5e-7 to 1e-6 on full models)."""

    # The `rlfleet rl dpo` stage: pairs sampled from the policy (docs/trainer.md "DPO").
    num_prompts: int = Field(0, ge=0)
    """Training prompts sampled for pairs, in data order (0 = every training row)."""
    samples_per_prompt: int = Field(4, ge=2)
    """K trajectories per prompt through the rollout and reward services."""
    prompts_in_flight: int = Field(8, ge=1)
    """Prompts sampled at once: a trajectory's wall time (multi_turn.max_trajectory_time_s)
    counts its wait for the engine, so all of them at once on a small machine would time
    out."""
    max_pairs_per_prompt: int = Field(2, ge=1)
    """At most this many pairs from one prompt (each hallucinated sample is used once)."""
    pairs_per_step: int = Field(8, ge=1)
    """Pairs per optimizer step."""
    epochs: int = Field(1, ge=1)
    """Passes over the pairs."""

    @model_validator(mode="after")
    def _variant_rules(self) -> DPOConfig:
        if self.loss_type == "ipo" and self.label_smoothing > 0:
            raise ValueError(
                f"dpo.label_smoothing ({self.label_smoothing}) has no meaning for "
                "dpo.loss_type=ipo; set dpo.label_smoothing=0 or use loss_type=sigmoid"
            )
        return self


class PreferenceError(DataError):
    """A preference-pair row is malformed; the message names the field."""


Message = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PreferencePair(_Strict):
    """One validated pair: the prompt (with its tools) and two continuations of it."""

    prompt: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    chosen: list[Message] = Field(min_length=1)
    rejected: list[Message] = Field(min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("chosen", "rejected", mode="before")
    @classmethod
    def _string_is_one_message(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("empty response")
            return [{"role": "assistant", "content": value}]
        return value

    @field_validator("prompt", "chosen", "rejected")
    @classmethod
    def _messages_have_roles(cls, messages: list[Message]) -> list[Message]:
        for i, message in enumerate(messages):
            if not isinstance(message.get("role"), str) or not message["role"]:
                raise ValueError(f"message {i} has no role")
        return messages

    @field_validator("chosen", "rejected")
    @classmethod
    def _starts_with_assistant(cls, messages: list[Message]) -> list[Message]:
        if messages[0]["role"] != "assistant":
            raise ValueError(
                f"must start with an assistant message (got role {messages[0]['role']!r})"
            )
        return messages

    @field_validator("tools")
    @classmethod
    def _tools_are_functions(cls, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, tool in enumerate(tools):
            spec = tool.get("function", tool)
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise ValueError(f"tool {i} has no function name")
        return tools

    @model_validator(mode="after")
    def _two_different_responses(self) -> PreferencePair:
        if self.chosen == self.rejected:
            raise ValueError("chosen and rejected are identical (no preference to learn)")
        return self


def parse_preference_pair(row: Any, where: str = "") -> PreferencePair:
    """`row` as a `PreferencePair`, or `PreferenceError('<where>: <field>: <problem>')`
    with one problem per line."""
    prefix = f"{where}: " if where else ""
    if not isinstance(row, dict):
        raise PreferenceError(f"{prefix}expected a JSON object, got {type(row).__name__}")
    try:
        return PreferencePair.model_validate(row)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"]) or "row"
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = "unknown field (expected prompt, tools, chosen, rejected, metadata)"
            lines.append(f"{prefix}{field}: {message}")
        raise PreferenceError("\n".join(lines)) from None


def read_preference_pairs(path: Path) -> list[PreferencePair]:
    """Every pair of a JSONL file, or of every *.jsonl under a folder (sorted); the first
    bad row raises `PreferenceError` naming its file:line and field."""
    return [parse_preference_pair(source.row, source.where) for source in read_blend(path)]
