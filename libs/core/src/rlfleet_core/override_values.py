"""Writing override values: the inverse of `overrides.parse_value`, for code that builds a
service's overrides from paths, names or a recipe section (so a value with a comma, a
bracket or a quote reaches the service intact)."""

from __future__ import annotations

import re

from rlfleet_core.overrides import OverrideError, parse_value


def quote_value(value: str) -> str:
    """`value` as an override value that parses back to exactly this string."""
    try:
        if parse_value(value) == value:
            return value
    except OverrideError:
        pass
    # Hydra's quoting: a backslash run before a quote (or the closing one) is doubled.
    escaped = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f'"{escaped}"'


def format_override(key: str, value: object) -> str:
    """`key=value` for code that builds overrides from paths or names."""
    return f"{key}={quote_value(str(value))}"


def format_value(value: object) -> str:
    """A YAML-like value (None, bool, number, str, list, dict with string keys) as an
    override value that parses back to it: for code that turns a recipe section into a
    service's overrides."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return quote_value(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{quote_value(str(k))}:{format_value(v)}" for k, v in value.items())
            + "}"
        )
    raise TypeError(f"cannot write {type(value).__name__} as an override value")
