"""`structured_outputs`: the response must be a document valid under a JSON schema.

Row fields (NeMo-Gym structured-outputs shape; its other fields are accepted and ignored):
- `schema_str` (required): the JSON schema, as a JSON string (an object is accepted too).
- `schema_type` (optional, default `json`): `json`, `yaml`, `xml`, `toml` or `csv`.
- `response_mode` (optional, default `text`): `text` grades the assistant text;
  `tool_call` grades the arguments of the response's one `function_call` item.
- `tool_name` (optional): with `tool_call`, the function the model must call.
- `tool_payload_key` (optional): with `tool_call`, the argument that holds the document.
- `extraction` (optional): `nemo_gym` (default) or `lenient` (json only).

`nemo_gym` gives the reward of NeMo-Gym 0.7's `structured_outputs` server (docs/reward.md
"Parity with NeMo-Gym"): the whole assistant text (every `message` item's output text
joined, a <think> part included) must parse as `schema_type` — a ```json fence or prose
around the document is a parse error — and validate under the schema made strict (every
listed property required, no others: structured_formats.py), as JSON Schema 2020-12
whatever `$schema` says; XML and CSV values are coerced to the schema's types first.
`lenient` (rlfleet's earlier behaviour): the last ```json fence (or the whole text) is
parsed as JSON and validated under the schema as written (by its `$schema` draft).

Reward 1 when it parses and validates; otherwise 0 with `info.verdict` = `empty_response`,
`parse_error`, `validation_error` (or, in tool_call mode, `missing_tool_call`,
`multiple_tool_calls`, `wrong_tool_name`, `tool_arguments_parse_error`,
`missing_tool_payload_key`) and the first error's message, so failure modes can be told
apart in metrics. A schema that is not valid JSON Schema is a bad row (INVALID_ARGUMENT),
not a 0.

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

from rlfleet_reward.environments.base import Environment, choice, optional_str, require
from rlfleet_reward.environments.structured_formats import (
    SCHEMA_TYPES,
    coerce_csv,
    coerce_xml,
    parse_document,
    strict_schema,
)
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
    schema_type: str = "json"
    extraction: str = "nemo_gym"
    response_mode: str = "text"
    tool_name: str | None = None
    tool_payload_key: str | None = None


@functools.lru_cache(maxsize=1024)
def _validator(schema_str: str) -> Any:
    """The compiled validator for a schema as written (by its `$schema` draft); schemas
    repeat across a dataset's rows."""
    import jsonschema

    schema = json.loads(schema_str)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return jsonschema.validators.extend(cls, {"uniqueItems": _unique_items})(schema)


@functools.lru_cache(maxsize=1024)
def _strict_validator(schema_str: str) -> Any:
    """NeMo-Gym's validator: the strict schema under JSON Schema 2020-12 (what its
    openapi-schema-validator OAS 3.1 validator checks, formats not asserted); raises
    jsonschema.SchemaError when making the schema strict broke it."""
    import jsonschema

    schema = strict_schema(schema_str)
    cls = jsonschema.Draft202012Validator
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
    description: ClassVar[str] = (
        "JSON/YAML/XML/TOML/CSV output validated against the row's JSON schema, as NeMo-Gym's "
        "structured_outputs server does."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("schema_str",)
    optional_fields: ClassVar[tuple[str, ...]] = (
        "schema_type",
        "response_mode",
        "tool_name",
        "tool_payload_key",
        "extraction",
    )
    preload_modules: ClassVar[tuple[str, ...]] = ("jsonschema", "regex", "yaml", "xmltodict")

    def parse_row(self, row: Mapping[str, Any]) -> StructuredSpec:
        import jsonschema

        raw = require(row, "schema_str")
        if isinstance(raw, dict):
            raw = json.dumps(raw, sort_keys=True)
        if not isinstance(raw, str):
            raise RowError(
                "schema_str", f"expected a JSON schema as a string, got {type(raw).__name__}"
            )
        schema_type = choice(row, "schema_type", SCHEMA_TYPES, "json")
        extraction = choice(row, "extraction", ("nemo_gym", "lenient"), "nemo_gym")
        if extraction == "lenient" and schema_type != "json":
            raise RowError("extraction", f"lenient reads JSON only; schema_type is {schema_type}")
        mode = choice(row, "response_mode", ("text", "tool_call"), "text")
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
        tool_name = optional_str(row, "tool_name", "") or None
        payload_key = optional_str(row, "tool_payload_key", "") or None
        return StructuredSpec(raw, schema_type, extraction, mode, tool_name, payload_key)

    def score(self, spec: StructuredSpec, sample: Sample) -> Score:
        _install_timed_re()
        if spec.extraction == "lenient":
            return self._score_lenient(spec, sample)
        if spec.response_mode == "tool_call":
            return self._score_tool_call(spec, sample)
        text = sample.nemo_gym_text
        if not text.strip():
            return binary("schema_valid", False, verdict="empty_response")
        if len(text) > MAX_DOCUMENT_CHARS:
            reason = f"document has {len(text)} characters (limit {MAX_DOCUMENT_CHARS})"
            return binary("schema_valid", False, verdict="answer_too_long", reason=reason)
        try:
            document = parse_document(spec.schema_type, text)
        except Exception as exc:  # whatever the format's parser raises is the model's error
            return binary("schema_valid", False, verdict="parse_error", error=_error(exc))
        return _validate_strict(spec, document)

    def _score_tool_call(self, spec: StructuredSpec, sample: Sample) -> Score:
        calls = sample.tool_calls
        if len(calls) != 1:
            verdict = "missing_tool_call" if not calls else "multiple_tool_calls"
            names = ", ".join(call.name for call in calls)
            return binary("schema_valid", False, verdict=verdict, called=names)
        call = calls[0]
        if spec.tool_name and call.name != spec.tool_name:
            return binary("schema_valid", False, verdict="wrong_tool_name", called=call.name)
        document: Any = call.arguments
        if UNPARSABLE_ARGUMENTS in document:  # not an object: NeMo-Gym validates any JSON
            try:
                document = json.loads(document[UNPARSABLE_ARGUMENTS])
            except (TypeError, ValueError) as exc:
                return binary(
                    "schema_valid", False, verdict="tool_arguments_parse_error", error=_error(exc)
                )
        if spec.tool_payload_key:
            if not isinstance(document, dict) or spec.tool_payload_key not in document:
                return binary("schema_valid", False, verdict="missing_tool_payload_key")
            document = document[spec.tool_payload_key]
        return _validate_strict(spec, document, coerce=False)

    def _score_lenient(self, spec: StructuredSpec, sample: Sample) -> Score:
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
        return _first_error(_validator(spec.schema_str), instance)


UNPARSABLE_ARGUMENTS = "<unparsable arguments>"
"""The key under which the HTTP face passes on a function_call's arguments that are not a
JSON object (as written)."""


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _validate_strict(spec: StructuredSpec, document: Any, *, coerce: bool = True) -> Score:
    import jsonschema

    try:
        validator = _strict_validator(spec.schema_str)
    except jsonschema.SchemaError as exc:  # the strict form of a valid schema can be invalid
        reason = f"the schema made strict is not valid: {exc.message}"
        return binary("schema_valid", False, verdict="validation_error", error=reason[:300])
    try:
        if coerce and spec.schema_type == "xml":
            document = coerce_xml(document, validator.schema)
        elif coerce and spec.schema_type == "csv":
            document = coerce_csv(document, validator.schema)
    except Exception as exc:  # a document the coercion cannot walk does not validate
        return binary("schema_valid", False, verdict="validation_error", error=_error(exc))
    return _first_error(validator, document)


def _first_error(validator: Any, instance: Any) -> Score:
    _TIMED_RE.deadline = time.process_time() + PATTERN_BUDGET_S
    try:
        error = next(iter(validator.iter_errors(instance)), None)
    except PatternTimeout as exc:
        reason = f"pattern {exc.args[0]!r} ran over {PATTERN_BUDGET_S} s of CPU on the answer"
        return binary("schema_valid", False, verdict="pattern_timeout", reason=reason[:300])
    except Exception as exc:  # e.g. a key xmltodict/csv made that jsonschema cannot compare
        return binary("schema_valid", False, verdict="validation_error", error=_error(exc))
    finally:
        _TIMED_RE.deadline = float("inf")
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "<root>"
        return binary(
            "schema_valid", False, verdict="validation_error", error=error.message, path=path
        )
    return binary("schema_valid", True, verdict="valid")
