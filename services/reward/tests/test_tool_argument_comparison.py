"""`single_step_tool_use_with_argument_comparison`: NeMo-Gym's argument rules
(resources_servers/single_step_tool_use_with_argument_comparison/common/
verification_utils.py) pinned case by case, and the judged arguments, with a scripted
judge over real HTTP (allowed only in these unit tests)."""

from __future__ import annotations

from typing import Any

import pytest
from judge_env_support import TOOL_ENV, score
from rlfleet_reward.environments import get_environment
from rlfleet_reward.environments.tool_argument_comparison import (
    ArgumentSpec,
    compare_values,
    words_similar,
)
from rlfleet_reward.types import FailureKind, RowError, Sample, ToolCall

# --- single_step_tool_use_with_argument_comparison ----------------------------------------

SPEC = ArgumentSpec("function_call", "f", "{}", (), 0.1, 1e-6)


def test_word_count_similarity_by_hand() -> None:
    # |E ∩ A| / (|E| + |A|): "refund the ticket" vs "please refund ticket now" -> 2 / 7
    assert words_similar("refund the ticket", "please refund ticket now", 2 / 7)
    assert not words_similar("refund the ticket", "please refund ticket now", 2 / 7 + 1e-9)
    # Case and surrounding blanks do not count; the measure is at most 1/2.
    assert words_similar(" Refund The ticket", "refund the TICKET ", 0.5)
    # Under two words on either side: exact, case included.
    assert words_similar("VIP", "VIP", 0.1) and not words_similar("VIP", "vip", 0.1)
    assert not words_similar("seat A12", "A12", 0.0)


@pytest.mark.parametrize(
    ("expected", "actual", "miss"),
    [
        (1, 1, None),
        (1, 1.0, "argument_value_type_different"),
        (1.0, 1, "argument_value_type_different"),
        (1, True, None),  # isinstance(True, int), as NeMo-Gym's check reads it
        (0.5, 0.5000001, None),
        (0.5, 0.501, "argument_value_different"),
        ("E1", "E2", "argument_value_different"),
        ([1, 2], [1, 2, 3], "argument_list_length_different"),
        ([1, 2], [2, 1], "argument_value_different"),
        ({"a": 1}, {"a": 1, "b": 2}, "argument_object_keys_different"),
        ({"a": {"b": [1.0]}}, {"a": {"b": [1.0]}}, None),
        (None, None, None),
        (None, 0, "argument_value_type_different"),
    ],
)
def test_argument_comparison_as_nemo_gym(expected: Any, actual: Any, miss: str | None) -> None:
    assert compare_values(expected, actual, SPEC) == miss


CALL_ROW = {
    "expected_action": {
        "type": "function_call",
        "name": "refund_order",
        "arguments": '{"order_id": "E17", "amount": 12.5, "note": "customer was double charged"}',
    }
}


def call(name: str = "refund_order", **arguments: Any) -> Sample:
    args = {"order_id": "E17", "amount": 12.5, "note": "charged twice, customer"} | arguments
    return Sample("", tool_calls=(ToolCall(name, args),))


@pytest.mark.parametrize(
    ("sample", "reward", "category"),
    [
        (call(), 1.0, "expected_tool_call"),
        (call(note="the customer was double charged"), 1.0, "expected_tool_call"),
        (call(note="charged"), 0.0, "argument_value_different"),
        (call(order_id="e17"), 0.0, "argument_value_different"),
        (call(amount=12), 0.0, "argument_value_type_different"),
        (call("cancel_order"), 0.0, "unexpected_tool"),
        (Sample("I will refund it."), 0.0, "no_expected_tool_call"),
        (Sample(""), 0.0, "no_action_found"),
        (Sample("<tool_call>{oops</tool_call>"), 0.0, "arguments_decode_error"),
        (
            Sample(
                '<tool_call>{"name": "refund_order", "arguments": {"order_id": "E17", '
                '"amount": 12.5, "note": "double charged"}}</tool_call>'
            ),
            1.0,
            "expected_tool_call",
        ),
    ],
)
async def test_tool_call_rewards(sample: Sample, reward: float, category: str) -> None:
    result, _ = await score(TOOL_ENV, CALL_ROW, sample, None)
    assert (result.reward, result.info["category"]) == (reward, category)
    assert result.components == {"action": reward}


async def test_surplus_calls_are_free_as_in_nemo_gym() -> None:
    wrong, right = call("cancel_order").tool_calls[0], call().tool_calls[0]
    result, _ = await score(TOOL_ENV, CALL_ROW, Sample("", tool_calls=(wrong, right)), None)
    assert (result.reward, result.info["num_calls"]) == (1.0, "2")


async def test_expected_message() -> None:
    row = {"expected_action": {"type": "message", "content": "Which order?"}}
    for sample, reward, category in [
        (Sample("Which order do you mean?"), 1.0, "expected_chat_message_found"),
        (call(), 0.0, "no_expected_chat_message"),
        (Sample(""), 0.0, "no_action_found"),
    ]:
        result, _ = await score(TOOL_ENV, row, sample, None)
        assert (result.reward, result.info["category"]) == (reward, category)


async def test_judged_argument_asks_the_judge_only_when_the_rest_matches() -> None:
    row = {**CALL_ROW, "judge_arguments": ["note"]}
    result, judge = await score(TOOL_ENV, row, call(), lambda _: "Same meaning. [[YES]]")
    assert (result.reward, result.info["judged"], len(judge.requests)) == (1.0, "1", 1)
    assert "customer was double charged" in judge.requests[0]["messages"][1]["content"]
    result, judge = await score(TOOL_ENV, row, call(), lambda _: "[[NO]]")
    assert result.reward == 0.0 and result.info["category"] == "argument_value_different"
    # A wrong id fails before the judge is asked; an identical note needs no judge.
    result, judge = await score(TOOL_ENV, row, call(order_id="E18"), lambda _: "[[YES]]")
    assert result.reward == 0.0 and judge.requests == []
    same = call(note="customer was double charged")
    result, judge = await score(TOOL_ENV, row, same, lambda _: "[[NO]]")
    assert result.reward == 1.0 and judge.requests == []
    result, _ = await score(TOOL_ENV, row, call(), lambda _: "maybe")
    assert result.failure_kind is FailureKind.JUDGE_ERROR
    assert "argument note: the judge's answer is not a verdict" in result.failure_reason


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({}, "expected_action"),
        ({"expected_action": "call f"}, "expected_action"),
        ({"expected_action": {"type": "function_call_batch"}}, "expected_action.type"),
        ({"expected_action": {"type": "function_call"}}, "expected_action.name"),
        (
            {"expected_action": {"type": "function_call", "name": "f", "arguments": "[1]"}},
            "expected_action.arguments",
        ),
        ({**CALL_ROW, "judge_arguments": ["amount"]}, "judge_arguments[0]"),
        ({**CALL_ROW, "judge_arguments": "note"}, "judge_arguments"),
        ({**CALL_ROW, "word_count_similarity_threshold": 2}, "word_count_similarity_threshold"),
    ],
)
def test_tool_rows_name_the_field(row: dict[str, Any], field: str) -> None:
    with pytest.raises(RowError) as err:
        get_environment(TOOL_ENV).parse_row(row)
    assert err.value.field == field
