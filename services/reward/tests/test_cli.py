"""`score_command`, the logic behind `rlfleet reward score`."""

from __future__ import annotations

import json

import pytest
from rlfleet_reward.cli import ScoreCommandError, parse_fields, score_command


def test_parse_fields_json_or_string() -> None:
    row = parse_fields(
        ["expected_answer=0.5", 'kwargs=[{"n": 1}]', "question=What is 1/2?", "flag=true", "a=b=c"]
    )
    assert row == {
        "expected_answer": 0.5,
        "kwargs": [{"n": 1}],
        "question": "What is 1/2?",
        "flag": True,
        "a": "b=c",
    }
    with pytest.raises(ScoreCommandError, match="expected key=value"):
        parse_fields(["novalue"])


def test_score_math_from_cli() -> None:
    result = score_command(
        "math", r"<think>hmm</think>so \boxed{\frac{1}{2}}", ["expected_answer=0.5"]
    )
    assert result["reward"] == 1.0 and result["reward_components"] == {"correctness": 1.0}
    assert result["failure_kind"] is None and result["info"]["extracted_answer"] == r"\frac{1}{2}"
    json.dumps(result)  # printable as JSON


def test_score_low_effort_enables_inner_env() -> None:
    result = score_command(
        "low_effort",
        "Answer: B",
        ["inner_env=mcqa", "expected_answer=B", "grading_mode=lenient", "token_budget=100"],
        num_tokens=50,
    )
    assert result["reward"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("env", "fields", "message"),
    [
        ("nope", [], "--env: unknown environment"),
        ("math", [], "--field expected_answer: required"),
        ("structured_outputs", ["schema_str={bad"], "--field schema_str: not valid JSON"),
        ("low_effort", ["inner_env=math", "expected_answer=1"], "--num-tokens"),
    ],
)
def test_bad_input_names_the_flag(env: str, fields: list[str], message: str) -> None:
    with pytest.raises(ScoreCommandError) as err:
        score_command(env, "x", fields)
    assert str(err.value).startswith(message), str(err.value)


def test_code_without_sandbox_is_an_explicit_failure() -> None:
    result = score_command("code", "print(1)", ['test_cases=[{"input": "", "output": "1"}]'])
    assert result["reward"] == 0.0 and result["failure_kind"] == "sandbox_error"
    assert "sandbox.target" in result["failure_reason"] and result["mask_sample"] is True


def test_code_with_unreachable_sandbox_is_a_sandbox_error() -> None:
    from reward_support import free_port

    result = score_command(
        "code",
        "print(1)",
        ['test_cases=[{"input": "", "output": "1"}]'],
        sandbox_target=f"127.0.0.1:{free_port()}",
    )
    assert result["failure_kind"] == "sandbox_error" and "UNAVAILABLE" in result["failure_reason"]
