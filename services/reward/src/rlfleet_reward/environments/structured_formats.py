"""Documents in the formats NeMo-Gym's structured_outputs server grades, read its way.

Each rule here reproduces a behaviour of NeMo-Gym 0.7's `structured_outputs` server, on
which the reward depends (services/reward/parity/ checks them against the server itself):
- the whole assistant text is parsed as the row's `schema_type` (no code-fence stripping);
- the schema is made strict first: every object schema that has `properties` requires all
  of them and allows no others (its `strictify_schema`, which walks nested objects but not
  lists such as `anyOf`);
- XML leaves (strings to xmltodict) and CSV cells (always strings) are coerced to the
  schema's scalar types before validation, unconvertible values left for it to reject.
"""

from __future__ import annotations

import csv
import io
import json
import tomllib
from typing import Any

SCHEMA_TYPES = ("json", "yaml", "xml", "toml", "csv")


def parse_document(schema_type: str, text: str) -> Any:
    """The document in `text`; raises (any exception) when it does not parse."""
    if schema_type == "json":
        return json.loads(text)
    if schema_type == "yaml":
        import yaml

        return yaml.safe_load(text)
    if schema_type == "xml":
        import xmltodict  # type: ignore[import-untyped]

        return xmltodict.parse(text)
    if schema_type == "toml":
        return tomllib.loads(text)
    if schema_type == "csv":
        return list(csv.DictReader(io.StringIO(text)))
    raise ValueError(f"unknown schema_type {schema_type!r}")


def strictify(schema: Any) -> None:
    """In place: objects with `properties` require them all and allow nothing else."""
    if isinstance(schema, dict):
        if "properties" in schema:
            schema["required"] = list(schema["properties"])
            schema["additionalProperties"] = False
        for value in schema.values():
            strictify(value)


def strict_schema(schema_str: str) -> Any:
    schema = json.loads(schema_str)
    strictify(schema)
    return schema


def _scalar(value: str, schema_type: Any) -> Any:
    """A CSV cell or XML leaf converted to `schema_type` when it reads as one."""
    try:
        if schema_type == "integer":
            return int(value)
        if schema_type == "number":
            return float(value)
        if schema_type == "boolean":
            if value.lower() in ("true", "1"):
                return True
            if value.lower() in ("false", "0"):
                return False
    except (ValueError, AttributeError):
        pass
    return value


def coerce_xml(data: Any, schema: Any) -> Any:
    """xmltodict's strings typed after `schema` (repeated children become arrays)."""
    if not isinstance(schema, dict) or "type" not in schema:
        return data
    kind = schema["type"]
    if kind == "object" and isinstance(data, dict):
        properties = schema.get("properties", {})
        return {
            key: coerce_xml(value, properties[key]) if key in properties else value
            for key, value in data.items()
        }
    if kind == "array":
        items = schema.get("items", {})
        # <tags><t>a</t><t>b</t></tags> reads as {"t": ["a", "b"]}; one child as {"t": "a"}.
        if isinstance(data, dict) and len(data) == 1:
            data = next(iter(data.values()))
        if not isinstance(data, list):
            data = [] if data is None else [data]
        return [coerce_xml(item, items) for item in data]
    if data is None and kind == "string":  # <a/> is "" for a string, still wrong for others
        return ""
    if isinstance(data, str):
        return _scalar(data, kind)
    return data


def coerce_csv(rows: list[dict[str, Any]], schema: Any) -> list[dict[str, Any]]:
    """csv.DictReader's strings typed after the row (`items`) schema's properties."""
    items = schema.get("items", schema)
    properties = items.get("properties", {})
    return [
        {
            key: _csv_cell(value, properties.get(key, {}).get("type", "string"))
            for key, value in row.items()
        }
        for row in rows
    ]


def _csv_cell(value: Any, kind: Any) -> Any:
    if isinstance(kind, list):  # ["integer", "null"]: the first type the cell converts to
        if (value is None or value == "") and "null" in kind:
            return None
        for option in kind:
            if option == "null":
                continue
            converted = _csv_cell(value, option)
            if option == "string" or not isinstance(converted, str):
                return converted
        return value
    if value is None or value == "":
        return value
    return _scalar(value, kind)
