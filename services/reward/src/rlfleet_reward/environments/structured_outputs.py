"""`structured_outputs`: the response must be a JSON document valid under a JSON schema.

Row fields (NeMo-Gym structured-outputs shape):
- `schema_str` (required): the JSON schema, as a JSON string (an object is accepted too).
- `schema_type` (optional): `json` (the only kind supported; others are refused).

The response may wrap the document in a ```json fence. Reward 1 when it parses and
validates; otherwise 0 with `info.verdict` = `parse_error` or `validation_error` and the
first error's message and path, so the two failure modes can be told apart in metrics.
A schema that is not valid JSON Schema is a bad row (INVALID_ARGUMENT), not a 0.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, choice, require
from rlfleet_reward.text import extract_json_text
from rlfleet_reward.types import RowError, Sample, Score, binary


@dataclass(frozen=True)
class StructuredSpec:
    schema_str: str


@functools.lru_cache(maxsize=1024)
def _validator(schema_str: str) -> Any:
    """The compiled validator for a schema; schemas repeat across a dataset's rows."""
    import jsonschema  # type: ignore[import-untyped]

    schema = json.loads(schema_str)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class StructuredOutputsEnvironment(Environment):
    name: ClassVar[str] = "structured_outputs"
    description: ClassVar[str] = "JSON output validated against the row's JSON schema (jsonschema)."
    required_fields: ClassVar[tuple[str, ...]] = ("schema_str",)
    optional_fields: ClassVar[tuple[str, ...]] = ("schema_type",)
    preload_modules: ClassVar[tuple[str, ...]] = ("jsonschema",)

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
        document = extract_json_text(sample.text)
        try:
            instance = json.loads(document)
        except json.JSONDecodeError as exc:
            return binary(
                "schema_valid",
                False,
                verdict="parse_error",
                error=f"{exc.msg} at line {exc.lineno} column {exc.colno}",
            )
        error = next(iter(_validator(spec.schema_str).iter_errors(instance)), None)
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path) or "<root>"
            return binary(
                "schema_valid", False, verdict="validation_error", error=error.message, path=path
            )
        return binary("schema_valid", True, verdict="valid")
