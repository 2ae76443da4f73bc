"""Reading pytest's `-rA` summary into per-test outcomes, and scoring them."""

from __future__ import annotations

import re

from rlfleet_proto.v1 import swe_pb2

_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED)\s+(\S+)")
_OUTCOME = {
    "PASSED": swe_pb2.TEST_OUTCOME_PASSED,
    "XFAIL": swe_pb2.TEST_OUTCOME_PASSED,  # as SWE-bench's harness counts them
    "XPASS": swe_pb2.TEST_OUTCOME_PASSED,
    "FAILED": swe_pb2.TEST_OUTCOME_FAILED,
    "ERROR": swe_pb2.TEST_OUTCOME_ERROR,
    "SKIPPED": swe_pb2.TEST_OUTCOME_SKIPPED,
}
# When one test shows twice (passed, then errored in teardown), the worse outcome stays.
_RANK = {
    swe_pb2.TEST_OUTCOME_SKIPPED: 0,
    swe_pb2.TEST_OUTCOME_PASSED: 1,
    swe_pb2.TEST_OUTCOME_FAILED: 2,
    swe_pb2.TEST_OUTCOME_ERROR: 3,
}


def parse_pytest(output: str) -> dict[str, swe_pb2.TestOutcome.ValueType]:
    """Outcome per test id from pytest -rA output (the "short test summary info" lines)."""
    seen: dict[str, swe_pb2.TestOutcome.ValueType] = {}
    for line in output.splitlines():
        match = _LINE.match(line)
        if not match or match.group(2).startswith("["):  # "SKIPPED [1] file:line" has no id
            continue
        outcome = _OUTCOME[match.group(1)]
        name = match.group(2)
        if name not in seen or _RANK[outcome] > _RANK[seen[name]]:
            seen[name] = outcome
    return seen


def score(
    outcomes: dict[str, swe_pb2.TestOutcome.ValueType],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
) -> tuple[bool, list[swe_pb2.TestResult]]:
    """(resolved, results): resolved = every required test passed; a required test absent
    from the output is MISSING (and so not resolved)."""
    required = list(dict.fromkeys([*fail_to_pass, *pass_to_pass]))
    results = [
        swe_pb2.TestResult(
            name=name,
            outcome=outcomes.get(name, swe_pb2.TEST_OUTCOME_MISSING),
            required=True,
        )
        for name in required
    ]
    results += [
        swe_pb2.TestResult(name=name, outcome=outcome, required=False)
        for name, outcome in outcomes.items()
        if name not in set(required)
    ]
    resolved = bool(required) and all(
        r.outcome == swe_pb2.TEST_OUTCOME_PASSED for r in results if r.required
    )
    return resolved, results
