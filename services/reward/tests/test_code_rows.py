"""`code` rows in NeMo-Gym code_gen's shape: `verifier_metadata.unit_tests`."""

from __future__ import annotations

import base64
import json
import zlib

import pytest
from rlfleet_reward.environments.code import CodeEnvironment
from rlfleet_reward.types import RowError

ENV = CodeEnvironment()


def packed(obj: object) -> str:
    return base64.b64encode(zlib.compress(json.dumps(obj).encode())).decode()


def test_unit_tests_become_stdin_stdout_cases() -> None:
    tests = {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "4\n"], "fn_name": None}
    spec = ENV.parse_row({"verifier_metadata": {"unit_tests": tests}})
    assert spec.cases == (("1\n", "1\n"), ("2\n", "4\n"))
    same = ENV.parse_row({"verifier_metadata": {"unit_tests": {"packed": packed(tests)}}})
    assert same.cases == spec.cases


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"difficulty": "easy"}, "verifier_metadata.unit_tests"),
        ({"unit_tests": {"inputs": ["1"], "outputs": []}}, "verifier_metadata.unit_tests"),
        ({"unit_tests": {"inputs": [1], "outputs": ["1"]}}, "verifier_metadata.unit_tests[0]"),
        (
            {"unit_tests": {"inputs": ["x"], "outputs": ["y"], "fn_name": "solve"}},
            "verifier_metadata.unit_tests.fn_name",
        ),
        ({"unit_tests": {"packed": "not base64!"}}, "verifier_metadata.unit_tests.packed"),
        ({"unit_tests": {"packed": packed([1])}}, "verifier_metadata.unit_tests.packed"),
    ],
)
def test_bad_unit_tests_name_the_field(metadata: dict[str, object], field: str) -> None:
    with pytest.raises(RowError) as info:
        ENV.parse_row({"verifier_metadata": metadata})
    assert info.value.field == field


def test_a_zip_bomb_is_refused_unpacked_only_to_the_cap() -> None:
    bomb = base64.b64encode(zlib.compress(b" " * (80 << 20), 9)).decode()
    with pytest.raises(RowError, match="unpacks to more than"):
        ENV.parse_row({"verifier_metadata": {"unit_tests": {"packed": bomb}}})


def test_test_cases_still_win_and_a_row_with_neither_is_refused() -> None:
    both = {"test_cases": [{"input": "", "output": "a"}], "verifier_metadata": {"x": 1}}
    assert ENV.parse_row(both).cases == (("", "a"),)
    with pytest.raises(RowError, match=r"verifier_metadata\.unit_tests"):
        ENV.parse_row({})
