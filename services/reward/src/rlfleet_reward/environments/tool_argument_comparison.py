"""`single_step_tool_use_with_argument_comparison`: the next action of a tool-use
trajectory (one step), compared with the demonstrated one, as NeMo-Gym's resources server
of that name does (its `common/verification_utils.py`, pinned in
the service's tests/test_tool_argument_comparison.py).

The expected action is a tool call or a chat message. A message is matched by any
assistant message (reward 1) and missed by a tool call. A call is matched by an actual
call with exactly the same tool name whose arguments compare equal field by field
(NeMo-Gym's `compare_tool_call_arguments`):
- the actual value must be an instance of the expected value's type (so `1` does not
  match `1.0`, while `true` matches an expected integer, as Python's isinstance says);
- objects: the same keys, each value compared recursively; lists: the same length,
  compared element by element;
- floats: equal within `floating_point_comparison_threshold` (1e-6);
- strings: if either side has fewer than 2 words, exactly equal; else their lower-cased
  word multisets must overlap: |A ∩ E| / (|A| + |E|) >= `word_count_similarity_threshold`
  (0.1, NeMo-Gym's config; the measure is at most 0.5);
- anything else (ints, bools, null): ==.
As there (parallel-call rewarding off), a response with several calls gets 1 if any of
them matches: surplus calls cost nothing. Our addition: the row's `judge_arguments` names
top-level string arguments whose meaning the LLM judge compares (`[[YES]]` / `[[NO]]`:
free text such as a message to a customer) instead of word counts; the judge is asked
only when everything else matched, and a failed judge call is a JUDGE_ERROR.

The call is read from structured tool calls when the face received them (NeMo-Gym
`function_call` items), else from the text as `tool_use` reads it.

Row fields:
- `expected_action` (required): `{"type": "function_call", "name": str, "arguments":
  object or JSON string of one}` or `{"type": "message"}` (`content` is ignored).
- `judge_arguments` (optional): names of top-level string arguments the judge compares.
- `word_count_similarity_threshold` (optional, 0-1, default 0.1);
  `floating_point_comparison_threshold` (optional, >= 0, default 1e-6).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import (
    Environment,
    Placement,
    RunContext,
    optional_number,
    require,
    require_str,
)
from rlfleet_reward.environments.judged import (
    JudgeFailed,
    ask_judge,
    deadline_of,
    judge_chat,
    judge_failure,
)
from rlfleet_reward.environments.tool_use import decode_arguments, parse_tool_calls
from rlfleet_reward.judge.fence import FENCE_RULE, fence
from rlfleet_reward.judge.labels import parse_yes_no
from rlfleet_reward.types import RowError, Sample, Score, ToolCall, scored

MAX_JUDGE_ARGUMENTS = 16
MAX_JUDGED_CALLS = 4
"""Calls of one response whose free-text arguments go to the judge (the step has one
call): the policy writes the calls, so their count must not multiply judge calls (a
1 MB response holds ~20,000 of them); calls past these are not judged and do not match."""


@dataclass(frozen=True)
class ArgumentSpec:
    kind: str
    """`function_call` or `message`."""
    name: str
    arguments_json: str
    judge_arguments: tuple[str, ...]
    word_threshold: float
    float_threshold: float


@dataclass(frozen=True)
class Comparison:
    """A call compared without the judge: `category` names why it missed (None = matched,
    given the judge says yes to each of `deferred`: (argument, expected, actual))."""

    category: str | None
    deferred: tuple[tuple[str, str, str], ...] = ()


def words_similar(expected: str, actual: str, threshold: float) -> bool:
    """NeMo-Gym's string rule: exact under 2 words, else word-count overlap."""
    want = Counter(expected.strip().lower().split())
    got = Counter(actual.strip().lower().split())
    if want.total() < 2 or got.total() < 2:
        return expected == actual
    return (want & got).total() / (want.total() + got.total()) >= threshold


def compare_values(expected: Any, actual: Any, spec: ArgumentSpec) -> str | None:
    """None if `actual` matches `expected`, else the NeMo-Gym category of the miss."""
    if not isinstance(actual, type(expected)):
        return "argument_value_type_different"
    if isinstance(expected, dict):
        if set(expected) != set(actual):
            return "argument_object_keys_different"
        for key, value in expected.items():
            miss = compare_values(value, actual[key], spec)
            if miss:
                return miss
        return None
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return "argument_list_length_different"
        for want, got in zip(expected, actual, strict=True):
            miss = compare_values(want, got, spec)
            if miss:
                return miss
        return None
    if isinstance(expected, float):
        ok = abs(actual - expected) < spec.float_threshold
    elif isinstance(expected, str):
        ok = words_similar(expected, actual, spec.word_threshold)
    else:
        ok = expected == actual
    return None if ok else "argument_value_different"


def compare_call(spec: ArgumentSpec, call: ToolCall) -> Comparison:
    if call.name != spec.name:
        return Comparison("unexpected_tool")
    expected: dict[str, Any] = json.loads(spec.arguments_json)
    actual = call.arguments
    if set(expected) != set(actual):
        return Comparison("argument_object_keys_different")
    deferred = []
    for key, want in expected.items():
        got = actual[key]
        if key in spec.judge_arguments:
            if not isinstance(got, str):
                return Comparison("argument_value_type_different")
            if got != want:
                deferred.append((key, want, got))
            continue
        miss = compare_values(want, got, spec)
        if miss:
            return Comparison(miss)
    return Comparison(None, tuple(deferred))


def judge_messages(tool: str, argument: str, expected: str, actual: str) -> list[dict[str, str]]:
    user = (
        f"A tool call to `{tool}` needs the argument `{argument}`.\n\n"
        f"# Expected value\n{expected}\n\n"
        f"# Value the assistant gave\n{fence('VALUE', actual)}\n\n"
        "Do the two values mean the same thing for this call (same request, facts and "
        "constraints; wording may differ)? Answer with exactly one label: [[YES]] or [[NO]]."
    )
    return judge_chat(
        "You compare tool-call arguments for meaning. End your answer with exactly one "
        "label: [[YES]] or [[NO]]. " + FENCE_RULE,
        user,
    )


class ToolArgumentComparisonEnvironment(Environment):
    name: ClassVar[str] = "single_step_tool_use_with_argument_comparison"
    description: ClassVar[str] = (
        "One step of a tool-use trajectory: the call (name exact, arguments compared field "
        "by field; chosen free-text fields by the LLM judge) or message vs the expected one"
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_action",)
    optional_fields: ClassVar[tuple[str, ...]] = (
        "judge_arguments",
        "word_count_similarity_threshold",
        "floating_point_comparison_threshold",
    )
    # `run` awaits the judge on the gateway's loop and never uses a worker: no pool room
    # is reserved for it (the judge client's own concurrency limit bounds the calls).
    placement: ClassVar[Placement] = "loop"

    def parse_row(self, row: Mapping[str, Any]) -> ArgumentSpec:
        action = require(row, "expected_action")
        if not isinstance(action, dict):
            raise RowError("expected_action", "expected an object with a `type`")
        kind = require_str(action, "type") if action.get("type") is not None else None
        if kind not in ("function_call", "message"):
            raise RowError(
                "expected_action.type",
                f"must be function_call or message (one step, one call); got {kind!r}",
            )
        words = optional_number(row, "word_count_similarity_threshold", 0.1, low=0, high=1)
        floats = optional_number(row, "floating_point_comparison_threshold", 1e-6, low=0)
        if kind == "message":
            if row.get("judge_arguments"):
                raise RowError("judge_arguments", "an expected message has no arguments")
            return ArgumentSpec("message", "", "{}", (), words, floats)
        try:
            name = require_str(action, "name")
        except RowError as exc:
            raise RowError(f"expected_action.{exc.field}", exc.problem) from None
        arguments = decode_arguments(action.get("arguments", {}))
        if arguments is None:
            raise RowError("expected_action.arguments", "expected an object or its JSON string")
        judged = row.get("judge_arguments") or []
        if not isinstance(judged, list) or len(judged) > MAX_JUDGE_ARGUMENTS:
            raise RowError("judge_arguments", f"expected a list of up to {MAX_JUDGE_ARGUMENTS}")
        for i, key in enumerate(judged):
            if not isinstance(key, str) or not isinstance(arguments.get(key), str):
                raise RowError(
                    f"judge_arguments[{i}]",
                    f"{str(key)[:60]!r} is not a string argument of the expected call",
                )
        return ArgumentSpec(
            "function_call", name, json.dumps(arguments), tuple(judged), words, floats
        )

    async def run(self, spec: ArgumentSpec, sample: Sample, ctx: RunContext) -> Score:
        calls, bad = (
            (list(sample.tool_calls), 0) if sample.tool_calls else parse_tool_calls(sample.text)
        )
        if spec.kind == "message":
            if calls:
                return _verdict(False, "no_expected_chat_message", len(calls))
            if not sample.text.strip():
                return _verdict(False, "no_action_found", 0)
            return _verdict(True, "expected_chat_message_found", 0)
        if not calls:
            category = "arguments_decode_error" if bad else "no_expected_tool_call"
            return _verdict(False, category if sample.text.strip() or bad else "no_action_found", 0)
        compared = [compare_call(spec, call) for call in calls]
        if any(c.category is None and not c.deferred for c in compared):
            return _verdict(True, "expected_tool_call", len(calls))
        pending = [c for c in compared if c.category is None]
        if not pending:
            return _verdict(False, next(c.category for c in compared if c.category), len(calls))
        deadline = deadline_of(ctx)
        for candidate in pending[:MAX_JUDGED_CALLS]:  # almost always one call
            answers = await asyncio.gather(
                *(
                    ask_judge(
                        ctx,
                        self.name,
                        judge_messages(spec.name, key, want, got),
                        parse_yes_no,
                        deadline,
                    )
                    for key, want, got in candidate.deferred
                )
            )
            failures = [
                (f"argument {key}", answer)
                for (key, _, _), answer in zip(candidate.deferred, answers, strict=True)
                if isinstance(answer, JudgeFailed)
            ]
            if failures:
                return judge_failure(failures, len(answers))
            if all(answers):
                return _verdict(True, "expected_tool_call", len(calls), judged=len(answers))
        judged = min(len(pending), MAX_JUDGED_CALLS)
        return _verdict(False, "argument_value_different", len(calls), judged=judged)


def _verdict(ok: bool, category: str, num_calls: int, **info: object) -> Score:
    return scored({"action": 1.0 if ok else 0.0}, category=category, num_calls=num_calls, **info)
