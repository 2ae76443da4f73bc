"""`structured_outputs`: the response must be a JSON document valid under a JSON schema.

Row fields (NeMo-Gym structured-outputs shape):
- `schema_str` (required): the JSON schema, as a JSON string (an object is accepted too).
- `schema_type` (optional): `json` (the only kind supported; others are refused).

The response may wrap the document in a ```json fence. Reward 1 when it parses and
validates; otherwise 0 with `info.verdict` = `parse_error` or `validation_error` and the
first error's message and path, so the two failure modes can be told apart in metrics.
A schema that is not valid JSON Schema is a bad row (INVALID_ARGUMENT), not a 0.

Regex keywords (`pattern`, `patternProperties`, and `additionalProperties` next to them)
run on the `regex` engine under one CPU-time budget per answer (`PATTERN_BUDGET_S`): a pattern
such as `^(a+)+$` backtracks exponentially on "aaaa...!", which used to hold a worker
until the pool's timeout. Past the budget the answer scores 0 with `verdict`
pattern_timeout and the pattern in `info.reason`. `uniqueItems` is checked in linear time
(jsonschema's pairwise check took 18 s on 2,000 objects). Documents over
`MAX_DOCUMENT_CHARS` (200,000) are not parsed (`verdict` answer_too_long).
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require
from rlfleet_reward.text import extract_json_text
from rlfleet_reward.types import RowError, Sample, Score, binary

PATTERN_BUDGET_S = 0.25
"""CPU seconds of regex matching one answer may use across all of its schema's patterns
(`regex` counts CPU time, so on a busy machine the wall time is several times this)."""
MAX_DOCUMENT_CHARS = 200_000
"""Longest JSON document that is parsed and validated."""


class PatternTimeout(Exception):
    """A schema pattern ran past the answer's budget; args: the pattern."""


class _TimedRe:
    """Stands in for the `re` module inside jsonschema's keyword code, whose regex
    keywords call `re.search`; searches run on `regex` with what is left of a CPU-time
    deadline.
    (jsonschema has no hook for its regex engine; test_pathological_answers.py
    fails if it stops reading `re.search` from these modules.)"""

    deadline = float("inf")

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    def search(self, pattern: str, string: str, flags: int = 0) -> Any:
        import regex  # type: ignore[import-untyped]

        left = self.deadline - time.process_time()
        if left <= 0:
            raise PatternTimeout(pattern)
        try:
            return regex.search(pattern, string, flags, timeout=min(left, 3600.0))
        except TimeoutError:
            raise PatternTimeout(pattern) from None


_TIMED_RE = _TimedRe()


@functools.cache
def _install_timed_re() -> None:
    from jsonschema import _keywords, _legacy_keywords, _utils  # type: ignore[import-untyped]

    for module in (_keywords, _legacy_keywords, _utils):
        module.re = _TIMED_RE


@dataclass(frozen=True)
class StructuredSpec:
    schema_str: str


@functools.lru_cache(maxsize=1024)
def _validator(schema_str: str) -> Any:
    """The compiled validator for a schema; schemas repeat across a dataset's rows."""
    import jsonschema

    schema = json.loads(schema_str)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return jsonschema.validators.extend(cls, {"uniqueItems": _unique_items})(schema)


def _canonical(value: Any) -> Any:
    """A hashable form equal exactly when JSON Schema calls two values equal (1 == 1.0,
    true != 1, key order ignored)."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _canonical(v)) for k, v in value.items()))
    return ("value", value)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
    """jsonschema's uniqueItems compares arrays of objects pairwise (2,000 objects took
    18 s); hashing a canonical form is linear."""
    import jsonschema

    if not (unique and validator.is_type(instance, "array")):
        return
    try:
        distinct = len({_canonical(item) for item in instance})
    except RecursionError:
        distinct = -1
    if distinct != len(instance):
        yield jsonschema.ValidationError(f"{_short(instance)} has non-unique elements")


def _short(instance: Any) -> str:
    text = repr(instance)
    return text if len(text) <= 200 else text[:200] + "..."


class StructuredOutputsEnvironment(Environment):
    name: ClassVar[str] = "structured_outputs"
    placement = "loop"  # cost per answer: docs/reward.md
    description: ClassVar[str] = "JSON output validated against the row's JSON schema (jsonschema)."
    required_fields: ClassVar[tuple[str, ...]] = ("schema_str",)
    optional_fields: ClassVar[tuple[str, ...]] = ("schema_type",)
    preload_modules: ClassVar[tuple[str, ...]] = ("jsonschema", "regex")

    def parse_row(self, row: Mapping[str, Any]) -> StructuredSpec:
        import jsonschema

        raw = require(row, "schema_str")
        if isinstance(raw, dict):
            raw = json.dumps(raw, sort_keys=True)
        if not isinstance(raw, str):
            raise RowError(
                "schema_str", f"expected a JSON schema as a string, got {type(raw).__name__}"
            )
        choice(row, "schema_type", ("json",), "json")
        try:
            schema = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise RowError(
                "schema_str", f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
            ) from None
        if not isinstance(schema, dict | bool):
            raise RowError(
                "schema_str",
                f"a JSON schema must be an object or a boolean, got {type(schema).__name__}",
            )
        try:
            _validator(raw)
        except jsonschema.SchemaError as exc:
            raise RowError("schema_str", f"not a valid JSON schema: {exc.message}") from None
        return StructuredSpec(schema_str=raw)

    def score(self, spec: StructuredSpec, sample: Sample) -> Score:
        _install_timed_re()
        document = extract_json_text(sample.text)
        if len(document) > MAX_DOCUMENT_CHARS:
            reason = f"document has {len(document)} characters (limit {MAX_DOCUMENT_CHARS})"
            return binary("schema_valid", False, verdict="answer_too_long", reason=reason)
        try:
            instance = json.loads(document)
        except json.JSONDecodeError as exc:
            return binary(
                "schema_valid",
                False,
                verdict="parse_error",
                error=f"{exc.msg} at line {exc.lineno} column {exc.colno}",
            )
        _TIMED_RE.deadline = time.process_time() + PATTERN_BUDGET_S
        try:
            error = next(iter(_validator(spec.schema_str).iter_errors(instance)), None)
        except PatternTimeout as exc:
            reason = f"pattern {exc.args[0]!r} ran over {PATTERN_BUDGET_S} s of CPU on the answer"
            return binary("schema_valid", False, verdict="pattern_timeout", reason=reason[:300])
        finally:
            _TIMED_RE.deadline = float("inf")
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "<root>"
            return binary(
                "schema_valid", False, verdict="validation_error", error=error.message, path=path
            )
        return binary("schema_valid", True, verdict="valid")
