from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_contracts.rows import (
    DataError,
    Manifest,
    env_of,
    prompt_messages,
    read_blend,
    row_problems,
    split_train_val,
    write_manifest,
    write_split,
)

GOOD = {
    "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]},
    "agent_ref": {"name": "math"},
    "expected_answer": "4",
}


def test_env_reference_forms() -> None:
    assert env_of(GOOD) == "math"
    assert env_of({"env": "mcqa", "agent_ref": {"name": "math"}}) == "mcqa"
    # the judge servers (issue 17): both safety servers are our `safety`
    assert env_of({"agent_ref": {"name": "over_refusal_detection"}}) == "safety"
    assert env_of({"agent_ref": {"name": "jailbreakv28k_transfer_llm_agent"}}) == "safety"
    assert env_of({}) == ""


def test_prompt_messages_accepts_string_and_messages() -> None:
    assert prompt_messages({"responses_create_params": {"input": "hi"}}) == [
        {"role": "user", "content": "hi"}
    ]
    assert prompt_messages(GOOD)[0]["content"] == "2+2?"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"agent_ref": {"name": "math"}}, "responses_create_params: missing or not an object"),
        (
            {"responses_create_params": {"input": []}, "env": "math"},
            "responses_create_params.input: expected",
        ),
        ({"responses_create_params": {"input": [{"content": "x"}]}, "env": "math"}, "with a role"),
        ({"responses_create_params": {"input": "x"}}, "env: missing"),
    ],
)
def test_row_problems_name_the_field(row: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in row_problems(row))


def test_read_blend_reports_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n{not json\n")
    rows = read_blend(path)
    assert next(rows).lineno == 1
    with pytest.raises(DataError, match=r"b.jsonl:3: invalid JSON"):
        next(rows)
    with pytest.raises(DataError, match="no such file"):
        next(read_blend(tmp_path / "missing.jsonl"))


def test_directory_blend_reads_files_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_text(json.dumps({**GOOD, "expected_answer": "b"}) + "\n")
    (tmp_path / "a.jsonl").write_text(json.dumps({**GOOD, "expected_answer": "a"}) + "\n")
    assert [s.row["expected_answer"] for s in read_blend(tmp_path)] == ["a", "b"]


def test_split_holds_out_the_last_rows() -> None:
    rows = [{"i": i} for i in range(10)]
    train, val = split_train_val(rows, 3)
    assert [r["i"] for r in val] == [7, 8, 9] and len(train) == 7
    with pytest.raises(DataError, match="lower --val-rows"):
        split_train_val(rows[:3], 3)


def test_split_files_and_manifest(tmp_path: Path) -> None:
    info = write_split(tmp_path, "train", [GOOD, {**GOOD, "env": "mcqa"}])
    assert (
        info["rows"] == 2
        and info["env_mix"] == {"math": 1, "mcqa": 1}
        and len(info["sha256"]) == 64
    )
    lines = (tmp_path / "train" / "data.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["env"] == "mcqa"
    path = write_manifest(tmp_path, Manifest(blend="b", sources={"x": "y"}, splits={"train": info}))
    assert json.loads(path.read_text())["splits"]["train"]["rows"] == 2


def test_nemo_gym_agent_and_server_names_map_to_environments() -> None:
    from rlfleet_contracts.rows import NEMO_GYM_NAMES, env_ref

    # ng_prepare_data 0.7 routes by task_source; older rows by agent_ref.name.
    assert env_of({"task_source": "math_with_judge_simple_agent"}) == "math"
    assert (
        env_of({"agent_ref": {"type": "responses_api_agents", "name": "code_gen_simple_agent"}})
        == "code"
    )
    assert (
        env_of({"agent_ref": {"name": "structured_outputs_v4_simple_agent"}})
        == "structured_outputs"
    )
    assert env_of({"env": "math_with_judge"}) == "math"  # a server name as env
    assert env_of({"agent_ref": {"name": "reasoning_gym_rewoo_agent"}}) == "reasoning_gym"
    # our names pass through; `env` wins over agent_ref, agent_ref over task_source
    assert env_of({"agent_ref": {"name": "mcqa"}, "task_source": "code_gen_simple_agent"}) == "mcqa"
    ref = env_ref({"task_source": "wordle_simple_agent"})
    assert ref is not None and (ref.env, ref.field) == ("wordle_simple_agent", "task_source")
    assert set(NEMO_GYM_NAMES.values()) == {
        "math",
        "mcqa",
        "structured_outputs",
        "instruction_following",
        "reasoning_gym",
        "code",
        "safety",
        "single_step_tool_use_with_argument_comparison",
    }


def test_unknown_agent_problem_names_the_field_and_known_agents() -> None:
    from rlfleet_contracts.rows import env_ref, unknown_env_problem

    ref = env_ref({"agent_ref": {"name": "wordle_simple_agent"}})
    assert ref is not None
    problem = unknown_env_problem(ref, ["math", "code"])
    assert problem.startswith("agent_ref.name: 'wordle_simple_agent' is neither")
    assert "math, code" in problem and "math_with_judge_simple_agent" in problem
    ref = env_ref({"env": "nope"})
    assert ref is not None
    assert unknown_env_problem(ref, ["math"]) == "env: unknown environment 'nope'; one of math"
