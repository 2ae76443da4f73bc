"""SWE instances as `swe_agent` training rows (stage SWE2): the bundled tiny blend, raw
SWE-bench-style JSONL, and rows that lack what the environment needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_contracts.rows import DataError, env_of
from rlfleet_dataprep.prep import PrepOptions, prepare_rl
from rlfleet_dataprep.swe import BUNDLED


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _instances() -> list[dict[str, object]]:
    return _rows(BUNDLED)


def test_tiny_swe2_blend_holds_out_an_instance(tmp_path: Path) -> None:
    out, manifest = prepare_rl("tiny-swe2", PrepOptions(out=tmp_path, val_rows=1))
    assert manifest.options["row_check"] == "reward environments"  # OpenEpisode's parse
    train, val = _rows(out / "train/data.jsonl"), _rows(out / "val/data.jsonl")
    assert (len(train), len(val)) == (3, 1)
    ids = [r["instance_id"] for r in train + val]
    assert sorted(ids) == sorted(i["instance_id"] for i in _instances())
    by_id = {i["instance_id"]: i for i in _instances()}
    for row in train + val:
        assert env_of(row) == "swe_agent"
        instance = by_id[row["instance_id"]]
        (message,) = row["responses_create_params"]["input"]  # type: ignore[index]
        assert message["role"] == "user"
        assert str(instance["problem_statement"]) in message["content"]
        assert "submit" in message["content"] and "/testbed" in message["content"]
        for field in ("image", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"):
            assert row[field] == instance[field], field
        assert "patch" not in row  # the gold fix never reaches the policy's rows


def test_raw_swe_bench_rows_are_converted(tmp_path: Path) -> None:
    blend = tmp_path / "swe-gym-like.jsonl"
    blend.write_text(BUNDLED.read_text())
    out, manifest = prepare_rl(str(blend), PrepOptions(out=tmp_path / "data", val_rows=2))
    assert manifest.splits["train"]["env_mix"] == {"swe_agent": 2}
    assert all(env_of(r) == "swe_agent" for r in _rows(out / "val/data.jsonl"))


@pytest.mark.parametrize(
    ("drop", "field"),
    [("image", "image: missing"), ("problem_statement", "problem_statement: missing")],
)
def test_rows_missing_what_the_env_needs_name_line_and_field(
    tmp_path: Path, drop: str, field: str
) -> None:
    rows = _instances()
    rows[1] = {k: v for k, v in rows[1].items() if k != drop}
    blend = tmp_path / "bad.jsonl"
    blend.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=rf"bad.jsonl:2: {field}"):
        prepare_rl(str(blend), PrepOptions(out=tmp_path / "data", val_rows=1))


def test_bad_test_lists_are_refused_by_the_environment_check(tmp_path: Path) -> None:
    rows = _instances()
    rows[0]["FAIL_TO_PASS"] = "not json"
    blend = tmp_path / "bad.jsonl"
    blend.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"bad.jsonl:1: FAIL_TO_PASS: expected a list"):
        prepare_rl(str(blend), PrepOptions(out=tmp_path / "data", val_rows=1))
