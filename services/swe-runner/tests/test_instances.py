"""The bundled tiny SWE instances: SWE-bench's row format, files shipped in the
rlfleet-dataprep wheel, and reproducible (rebuilding them from make_swe_tiny.py's sources
gives the same base_commit, patches and test lists as instances.jsonl)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from rlfleet_swe.images import bundled_instances_dir
from rlfleet_swe.instances import SweInstance, load_instances

FOLDER = bundled_instances_dir()
SWE_BENCH_FIELDS = {"instance_id", "repo", "base_commit", "patch", "test_patch",
                    "FAIL_TO_PASS", "PASS_TO_PASS"}  # fmt: skip


def test_rows_are_swe_bench_rows() -> None:
    lines = (FOLDER / "instances.jsonl").read_text().splitlines()
    assert len(lines) >= 3
    for line in lines:
        row = json.loads(line)
        assert set(row) >= SWE_BENCH_FIELDS
        # As SWE-bench publishes them: JSON strings holding lists of pytest node ids.
        assert json.loads(row["FAIL_TO_PASS"]) and json.loads(row["PASS_TO_PASS"])
        assert (FOLDER / "repos" / f"{row['instance_id']}.patch").is_file()
    rows = load_instances(FOLDER / "instances.jsonl")
    assert all("::" in name for row in rows for name in row.fail_to_pass + row.pass_to_pass)


def test_list_or_json_string_lists_load_the_same() -> None:
    base = {"instance_id": "a__b-1", "FAIL_TO_PASS": '["t.py::x"]', "PASS_TO_PASS": ""}
    as_lists = {**base, "FAIL_TO_PASS": ["t.py::x"], "PASS_TO_PASS": []}
    assert SweInstance.model_validate(base) == SweInstance.model_validate(as_lists)


def test_rebuilding_gives_the_same_rows() -> None:
    spec = importlib.util.spec_from_file_location("make_swe_tiny", FOLDER / "make_swe_tiny.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = {json.loads(line)["instance_id"]: json.loads(line)
               for line in (FOLDER / "instances.jsonl").read_text().splitlines()}  # fmt: skip
    for source in module.INSTANCES:
        row, snapshot = module.build(source)
        assert row == shipped[row["instance_id"]]
        assert snapshot == (FOLDER / "repos" / f"{row['instance_id']}.patch").read_text()


@pytest.mark.slow
def test_the_wheel_ships_the_instances(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[3]
    subprocess.run(
        ["uv", "build", "--quiet", "--wheel", str(root / "libs" / "dataprep"), "-o", str(tmp_path)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    prefix = "rlfleet_dataprep/bundled/swe_tiny/"
    assert prefix + "instances.jsonl" in names
    for row in load_instances(FOLDER / "instances.jsonl"):
        assert f"{prefix}repos/{row.instance_id}.patch" in names


def test_a_swe_bench_row_loads() -> None:
    # Field names and encodings as in SWE-bench's published rows (extra fields are ignored).
    row = {
        "repo": "astropy/astropy", "instance_id": "astropy__astropy-12907",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607", "patch": "diff --git a/x b/x\n",
        "test_patch": "diff --git a/t b/t\n", "problem_statement": "...", "hints_text": "",
        "created_at": "2022-03-03T15:14:54Z", "version": "4.3",
        "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
        "PASS_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_coord_matrix"]',
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    }  # fmt: skip
    instance = SweInstance.model_validate(row)
    assert instance.fail_to_pass == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
    ]
    assert instance.pass_to_pass == ["astropy/modeling/tests/test_separable.py::test_coord_matrix"]
    assert instance.workdir == "/testbed" and instance.image == ""
