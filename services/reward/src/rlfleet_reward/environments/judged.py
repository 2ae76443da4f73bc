"""Per-response environments graded by the LLM judge (`safety`, `multi_challenge`'s
question items, `single_step_tool_use_with_argument_comparison`'s judged arguments).

Such an environment overrides `Environment.run`, which the gateway awaits on its own event
loop (never in a worker: the judge client, its connection pool, concurrency limit and
cache live in the gateway process), and asks through `ask_judge`. The budget is the
call's: `ctx.timeout_s` is already capped by the caller's deadline, and the judge call
is given what is left of it, so a judge that hangs or answers garbage ends as a
JUDGE_ERROR with the reason before the gateway's own timeout fires.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rlfleet_reward.environments.base import RunContext
from rlfleet_reward.judge.client import JUDGE_PARSE_FAILURES, JudgeClient, JudgeError
from rlfleet_reward.judge.genrm import VerdictError
from rlfleet_reward.types import FailureKind, RowError, Score, failure

T = TypeVar("T")

NO_JUDGE = "no judge is configured on this gateway (set judge.base_url)"
LABEL_OPENING = "[["
"""How a label verdict (`[[YES]]`, `[[REFUSED]]`...) starts: written for the judge with
`judge.prefill`."""


@dataclass(frozen=True)
class JudgeFailed:
    """Why a judge call gave no verdict."""

    reason: str


def content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise RowError(f"{where}[{k}]", "expected a content part with a `text` string")
            parts.append(text)
        return "".join(parts)
    raise RowError(
        where, f"expected a string or a list of text parts, got {type(content).__name__}"
    )


def conversation_of(row: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """`responses_create_params.input` as (role, text) pairs (a string = one user turn)."""
    params = row.get("responses_create_params")
    messages = params.get("input") if isinstance(params, dict) else None
    where = "responses_create_params.input"
    if isinstance(messages, str) and messages.strip():
        return (("user", messages),)
    if not isinstance(messages, list) or not messages:
        raise RowError(where, "required: the conversation as a list of messages (or a string)")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RowError(f"{where}[{i}]", "expected a message with a `role` string")
        out.append((m["role"], content_text(m.get("content", ""), f"{where}[{i}].content")))
    return tuple(out)


def conversation_section(conversation: Sequence[tuple[str, str]]) -> str:
    """A judge prompt's `# Conversation` section: each turn as `[role]`, then its text."""
    chat = "\n\n".join(f"[{role}]\n{content}" for role, content in conversation)
    return f"# Conversation\n{chat}"


def judge_chat(instructions: str, task: str) -> list[dict[str, str]]:
    """A judge's messages: its instructions as the system turn, the task as one user turn."""
    return [{"role": "system", "content": instructions}, {"role": "user", "content": task}]


def deadline_of(ctx: RunContext) -> float:
    """The monotonic time by which this call's judge work must be done."""
    return time.monotonic() + ctx.timeout_s


async def ask_judge(
    ctx: RunContext,
    env: str,
    messages: list[dict[str, str]],
    parse: Callable[[str], T],
    deadline: float,
    opening: str = LABEL_OPENING,
) -> T | JudgeFailed:
    """`parse` of the judge's answer, or why there is none (no judge, no time, no answer,
    an answer that is not a verdict: the last counted in the parse-failure metric)."""
    judge: JudgeClient | None = ctx.judge()
    if judge is None:
        return JudgeFailed(NO_JUDGE)
    left = deadline - time.monotonic()
    if left <= 0:
        return JudgeFailed("no time left in the budget to ask the judge")
    try:
        return await judge.chat(messages, left, parse, opening)
    except JudgeError as exc:
        return JudgeFailed(str(exc))
    except VerdictError as exc:
        JUDGE_PARSE_FAILURES.labels(env).inc()
        return JudgeFailed(f"the judge's answer is not a verdict: {exc}")


def judge_failure(failures: list[tuple[str, JudgeFailed]], total: int, **info: Any) -> Score:
    """One JUDGE_ERROR Score for the failed judge calls of a response (`what`, failure)."""
    shown = "; ".join(f"{what}: {f.reason}" for what, f in failures[:3])
    more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
    return failure(
        FailureKind.JUDGE_ERROR,
        f"{len(failures)} of {total} judge calls failed: {shown}{more}",
        verdict="judge_error",
        **info,
    )
