"""The trainer reads blends the way data prep writes them (rlfleet_contracts.rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_contracts.rows import DataError
from rlfleet_trainer.data import read_rows, row_env, row_messages


def _write(path: Path, rows: list[object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")


def test_read_rows_takes_a_file_or_every_jsonl_under_a_folder(tmp_path: Path) -> None:
    _write(tmp_path / "b" / "data.jsonl", [{"id": "b0"}])
    _write(tmp_path / "a.jsonl", [{"id": "a0"}, {"id": "a1"}])
    assert [r["id"] for r in read_rows(tmp_path / "a.jsonl")] == ["a0", "a1"]
    assert [r["id"] for r in read_rows(tmp_path)] == ["a0", "a1", "b0"]  # sorted paths


def test_bad_lines_name_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"id": 1}\n{oops\n')
    with pytest.raises(DataError, match=r"x\.jsonl:2: invalid JSON"):
        read_rows(tmp_path / "x.jsonl")
    (tmp_path / "y.jsonl").write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"y\.jsonl:1: expected a JSON object, got list"):
        read_rows(tmp_path / "y.jsonl")
    with pytest.raises(DataError, match="no such file"):
        read_rows(tmp_path / "missing.jsonl")


def test_env_and_messages_of_a_row() -> None:
    row = {"env": "math", "agent_ref": {"name": "other"}, "responses_create_params": {}}
    assert row_env(row, "default") == "math"
    assert row_env({"agent_ref": {"name": "code"}}, "default") == "code"
    assert row_env({}, "default") == "default"
    plain = {"responses_create_params": {"input": "2+2?"}}
    assert row_messages(plain) == [{"role": "user", "content": "2+2?"}]
    extra = {"responses_create_params": {"input": [{"role": "user", "content": "hi", "x": 1}]}}
    assert row_messages(extra) == [{"role": "user", "content": "hi"}]
    with pytest.raises(DataError, match="responses_create_params"):
        row_messages({"id": "r"})
