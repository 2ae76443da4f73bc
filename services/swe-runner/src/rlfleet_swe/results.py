"""Per-test outcomes from the report plugin (see driver.py), the test-machinery check on
patches, and scoring."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable

from rlfleet_proto.v1 import swe_pb2

_OUTCOME = {
    "passed": swe_pb2.TEST_OUTCOME_PASSED,
    "failed": swe_pb2.TEST_OUTCOME_FAILED,
    "error": swe_pb2.TEST_OUTCOME_ERROR,
    "skipped": swe_pb2.TEST_OUTCOME_SKIPPED,
}


def parse_report(encoded: str) -> dict[str, swe_pb2.TestOutcome.ValueType] | None:
    """Outcome per test id from the plugin's report (base64 of a JSON object); None when
    the run left no readable report."""
    try:
        data = json.loads(base64.b64decode(encoded, validate=True) or b"null")
    except (binascii.Error, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {
        str(name): _OUTCOME[outcome]
        for name, outcome in data.items()
        if isinstance(outcome, str) and outcome in _OUTCOME
    }


_DIFF_PATHS = re.compile(
    r"^(?:diff --git a/(\S+) b/(\S+)|(?:\+\+\+|---) (?:[ab]/)?(\S+)|(?:rename|copy) (?:from|to) (\S+))",
    re.M,
)


def patch_paths(patch: str) -> set[str]:
    """The repository paths a unified diff touches (both sides of renames and copies)."""
    return {
        path
        for match in _DIFF_PATHS.finditer(patch)
        for path in match.groups()
        if path and path != "/dev/null"
    }


def touches_test_machinery(patch: str, test_patch: str, protected: Iterable[str]) -> list[str]:
    """Paths of `patch` that could change how tests run or report: files the test patch
    writes, and files whose name is in `protected` (conftest.py, pytest config,
    sitecustomize, ...; `*.pth` style patterns match suffixes)."""
    names = list(protected)
    tests = patch_paths(test_patch)
    hits = []
    for path in sorted(patch_paths(patch)):
        base = path.rsplit("/", 1)[-1]
        if (
            path in tests
            or base in names
            or any(n.startswith("*") and base.endswith(n[1:]) for n in names)
        ):
            hits.append(path)
    return hits


def score(
    outcomes: dict[str, swe_pb2.TestOutcome.ValueType],
    fail_to_pass: list[str],
    pass_to_pass: list[str],
) -> tuple[bool, list[swe_pb2.TestResult]]:
    """(resolved, results): resolved = every required test passed; a required test absent
    from the report is MISSING (and so not resolved)."""
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
