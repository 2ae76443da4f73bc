"""Domain types of the reward gateway, independent of gRPC and HTTP.

Both faces translate their wire shapes into `Sample` and back from `Score`, so an
environment never sees a protobuf or a FastAPI request. Everything here is picklable:
specs and samples cross into verifier worker processes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class FailureKind(enum.Enum):
    """Why a reward could not be computed; mirrors rlfleet.v1.FailureKind (same order)."""

    NONE = 0
    INVALID_ROW = 1
    TIMEOUT = 2
    VERIFIER_ERROR = 3
    SANDBOX_ERROR = 4
    JUDGE_ERROR = 5
    OVERLOADED = 6

    @property
    def wire_name(self) -> str | None:
        """The NeMo-Gym-style lowercase name used on the HTTP face (None when no failure)."""
        return None if self is FailureKind.NONE else self.name.lower()


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made: `arguments` is the decoded JSON object."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Sample:
    """One model response to score.

    text: the final answer (reasoning stripped); reasoning_text: the thinking part;
    num_tokens: generated tokens (0 = unknown); tool_calls: calls the model made, if the
    face received them as structured items (the HTTP face's `function_call` outputs);
    output_text: the assistant text exactly as NeMo-Gym's servers read it (every `message`
    item's `output_text` joined with no separator, any <think> part kept, `reasoning`
    items left out); None when the face has only `text` (then `text` stands in).
    """

    text: str
    reasoning_text: str = ""
    num_tokens: int = 0
    tool_calls: tuple[ToolCall, ...] = ()
    output_text: str | None = None

    @property
    def nemo_gym_text(self) -> str:
        """What a NeMo-Gym resources server would grade: `output_text`, else `text`."""
        return self.text if self.output_text is None else self.output_text


@dataclass
class Score:
    """A verifier's verdict. Invariant: sum(components) == reward (checked in __post_init__).

    A failure has reward 0, no components, a kind and a reason, and masks the sample:
    the trainer must not read it as "the answer was wrong".
    """

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    failure_kind: FailureKind = FailureKind.NONE
    failure_reason: str = ""
    mask_sample: bool = False
    info: dict[str, str] = field(default_factory=dict)
    latency_s: float = 0.0
    """Request-to-verdict time, set by the gateway."""

    def __post_init__(self) -> None:
        total = sum(self.components.values())
        if abs(total - self.reward) > 1e-9:
            raise ValueError(
                f"reward ({self.reward}) must equal the sum of its components ({total})"
            )
        if self.failure_kind is not FailureKind.NONE and not self.failure_reason:
            raise ValueError(f"a {self.failure_kind.name} failure needs a reason")

    @property
    def failed(self) -> bool:
        return self.failure_kind is not FailureKind.NONE


def scored(components: dict[str, float], **info: object) -> Score:
    """A computed reward: the sum of `components`, with `info` for debugging."""
    return Score(
        reward=float(sum(components.values())),
        components=dict(components),
        info={k: _short(v) for k, v in info.items()},
    )


def binary(name: str, ok: bool, **info: object) -> Score:
    """A 0/1 reward with one named component (the common case for verifiable tasks)."""
    return scored({name: 1.0 if ok else 0.0}, **info)


def failure(kind: FailureKind, reason: str, **info: object) -> Score:
    """A reward that could not be computed: 0, masked, with kind and reason."""
    return Score(
        reward=0.0,
        failure_kind=kind,
        failure_reason=reason,
        mask_sample=True,
        info={k: _short(v) for k, v in info.items()},
    )


def _short(value: object, limit: int = 500) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RowError(ValueError):
    """The data row lacks or mistypes a field the environment needs.

    `field` is the row key (dotted for nested ones); faces turn it into INVALID_ARGUMENT
    "row.<field>: <problem>" (gRPC) or HTTP 422 naming the same key.
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class Overloaded(RuntimeError):
    """The verifier queue is full; the caller should retry later (RESOURCE_EXHAUSTED)."""
