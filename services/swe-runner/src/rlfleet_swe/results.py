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


def parse_report(encoded: str) -> tuple[dict[str, swe_pb2.TestOutcome.ValueType], str]:
    """(outcome per test id, error) from the driver's verdict on the plugin's stream
    (base64 of a JSON object, see driver.py). A run whose stream was tampered with, or that
    did not finish, has no outcomes (every test MISSING) and says why in `error`."""
    try:
        data = json.loads(base64.b64decode(encoded, validate=True) or b"null")
    except (binascii.Error, ValueError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("outcomes"), dict):
        return {}, "the test run left no report (the driver did not finish)"
    if data.get("tampered"):
        return {}, f"the test report was tampered with: {data['tampered']}; not resolved"
    if not data.get("plugin_loaded"):
        return {}, "the report plugin did not load (is the test command pytest?)"
    if not data.get("finished"):
        return {}, "the test run did not finish (pytest was killed or exited early)"
    outcomes = {
        str(name): _OUTCOME[outcome]
        for name, outcome in data["outcomes"].items()
        if isinstance(outcome, str) and outcome in _OUTCOME
    }
    return outcomes, ""


def decode_refusal(encoded: str) -> str:
    try:
        return base64.b64decode(encoded, validate=True).decode(errors="replace")
    except (binascii.Error, ValueError):
        return "the patch was refused"


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(text: str) -> tuple[str, str]:
    """(path, rest) of a C-quoted path at the start of `text` (git's quoting of names with
    spaces, quotes, control or non-ASCII bytes: octal escapes are UTF-8 bytes)."""
    out = bytearray()
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return out.decode("utf-8", "surrogateescape"), text[i + 1 :]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt in "01234567":
                digits = re.match(r"[0-7]{1,3}", text[i + 1 :])
                assert digits
                out.append(int(digits.group(), 8) & 0xFF)
                i += 1 + len(digits.group())
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt) if nxt.isascii() else 63))
            i += 2
            continue
        out += ch.encode("utf-8", "surrogateescape")
        i += 1
    return out.decode("utf-8", "surrogateescape"), ""


def _path_field(text: str) -> list[str]:
    """The path at the start of a `---`/`+++`/rename/copy header field."""
    if text.startswith('"'):
        return [_unquote(text)[0]]
    return [text.split("\t", 1)[0].rstrip("\r")]


def _git_header_paths(rest: str) -> list[str]:
    """Both paths of `diff --git A B`; with unquoted names that hold spaces the split is
    ambiguous, so every split is returned (this is a refusal check: more is safer)."""
    rest = rest.rstrip("\r")
    if rest.startswith('"'):
        first, tail = _unquote(rest)
        tail = tail.lstrip(" ")
        return [first, *_path_field(tail)]
    if rest.endswith('"') and ' "' in rest:
        cut = rest.index(' "')
        return [rest[:cut], _unquote(rest[cut + 1 :])[0]]
    paths = []
    for match in re.finditer(" ", rest):
        paths += [rest[: match.start()], rest[match.end() :]]
    return paths or [rest]


def _strip_one(path: str) -> list[str]:
    # git apply's default -p1; the unstripped form too (a diff made without prefixes).
    return [path, path.split("/", 1)[1]] if "/" in path else [path]


def patch_paths(patch: str) -> set[str]:
    """The repository paths a unified diff touches (both sides of renames and copies),
    quoted names decoded."""
    paths: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            for path in _git_header_paths(line[len("diff --git ") :]):
                paths += _strip_one(path)
        elif line.startswith(("--- ", "+++ ")):
            for path in _path_field(line[4:]):
                paths += _strip_one(path)
        else:
            for prefix in ("rename from ", "rename to ", "copy from ", "copy to "):
                if line.startswith(prefix):
                    paths += _path_field(line[len(prefix) :])
    return {p for p in paths if p and p != "/dev/null" and p != "dev/null"}


IMPORT_MACHINERY = (".dist-info", ".egg-info", ".egg-link", ".egg", "__pycache__", ".pyc", ".pyo")
"""Endings of path parts no patch may have: package metadata (an entry_points.txt in it
makes pytest load a `pytest11` plugin at start-up from any sys.path folder, the
repository's root among them: a plugin that rewrites every report to "passed") and
byte code (an unchecked-hash .pyc runs in place of its source). The in-container driver
refuses the same in the applied tree (driver.py)."""


def import_machinery_part(path: str) -> str | None:
    """The part of `path` that is package metadata or byte code (IMPORT_MACHINERY), or None."""
    return next((part for part in path.split("/") if part.endswith(IMPORT_MACHINERY)), None)


def touches_test_machinery(patch: str, test_patch: str, protected: Iterable[str]) -> list[str]:
    """Paths of `patch` that could change how tests run or report: files the test patch
    writes, files whose name is in `protected` (conftest.py, pytest config,
    sitecustomize, ...; `*.pth` style patterns match suffixes), and package metadata or
    byte code (IMPORT_MACHINERY)."""
    names = list(protected)
    tests = patch_paths(test_patch)
    hits = []
    for path in sorted(patch_paths(patch)):
        base = path.rsplit("/", 1)[-1]
        if (
            path in tests
            or base in names
            or any(n.startswith("*") and base.endswith(n[1:]) for n in names)
            or import_machinery_part(path) is not None
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
