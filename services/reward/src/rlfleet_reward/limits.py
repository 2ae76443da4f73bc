"""Input limits of the reward gateway, checked before any work is done.

Both faces parse request JSON with `loads` and check every decoded value with a
`JsonCheck`: a request over a limit, or one the service could not answer faithfully
(NaN, a lone surrogate, a 5,000-digit integer, nesting deeper than the parser's
recursion), is refused with `InvalidArgument(field, problem)` naming the field and the
limit — never a 500 after scoring, never a verifier fed with it. `TooLarge` marks the
size limits, which the HTTP face answers with 413 instead of 422.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rlfleet_core.errors import InvalidArgument

from rlfleet_reward.config import LimitsConfig

_SURROGATE = re.compile("[\ud800-\udfff]")


class TooLarge(InvalidArgument):
    """A size limit was exceeded (HTTP 413; gRPC INVALID_ARGUMENT, retrying cannot help)."""


class NotJson(InvalidArgument):
    """The text is not JSON at all (as opposed to JSON over a limit)."""


class _Rejected:
    """Stands in for a JSON token the service refuses, so the walk can name its field."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _parse_constant(name: str) -> _Rejected:
    return _Rejected(f"{name} is not a JSON number; use a finite number or null")


def loads(text: str | bytes, field: str, limits: LimitsConfig) -> Any:
    """Parse JSON; InvalidArgument (naming `field`) if it is malformed or nests too deep
    for the parser. Refused tokens (NaN, integers over Python's 4300-digit cap) come back
    as `_Rejected` markers that `JsonCheck` reports with their path."""
    try:
        return _parse(text, field, limits, parse_int=None)
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
    # Only now pay for a Python call per integer: it marks the over-long one, so the
    # error can name its field.
    return _parse(text, field, limits, parse_int=lambda t: _parse_int(t, limits.max_int_digits))


def _parse_int(token: str, max_digits: int) -> int | _Rejected:
    digits = len(token.lstrip("-"))
    if digits > max_digits:
        return _Rejected(
            f"an integer of {digits} digits exceeds limits.max_int_digits ({max_digits})"
        )
    return int(token)


def _parse(text: str | bytes, field: str, limits: LimitsConfig, parse_int: Any) -> Any:
    try:
        return json.loads(text, parse_constant=_parse_constant, parse_int=parse_int)
    except json.JSONDecodeError as exc:
        raise NotJson(
            field, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except UnicodeDecodeError as exc:
        raise NotJson(field, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise InvalidArgument(
            field, f"nested deeper than limits.max_json_depth ({limits.max_json_depth})"
        ) from None


def check_text(value: str, field: str) -> None:
    """A string the service can echo and encode: no lone UTF-16 surrogates."""
    found = None if value.isascii() else _SURROGATE.search(value)
    if found is not None:
        raise InvalidArgument(
            field,
            f"contains a lone surrogate (U+{ord(found.group()):04X} at index {found.start()}); "
            "strings must be valid Unicode",
        )


class JsonCheck:
    """Checks decoded JSON values against the limits, counting across calls (one per
    request): nodes toward `max_json_nodes`, characters of text (string values and keys)
    in `chars`, for the callers' size limits. Raises InvalidArgument naming the first
    offending field (`field.key[3].x`)."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self.nodes = 0
        self.chars = 0

    def check(self, value: Any, field: str) -> int:
        """Check `value`; return the characters of text it holds."""
        nodes, chars = self.nodes, self.chars
        if not self._quick(value):
            # Something may be over a limit: the exact walk names the field (or finds
            # that only the quick walk's shortcuts were too cautious).
            self.nodes, self.chars = nodes, chars
            self.walk(value, field, 0)
        return self.chars - chars

    def _quick(self, value: Any) -> bool:
        """The counts of `walk` without building a field path per value (which cost more
        than the rest of a structured-output request: issue 28); False, counts
        undefined, on anything `walk` could refuse, including every container longer
        than the tightest item limit and every type json.loads does not make exactly."""
        limits = self.limits
        max_depth = limits.max_json_depth
        max_items = min(limits.max_json_items, *limits.max_field_items.values())
        max_bits = 3.3 * limits.max_int_digits - 4
        surrogate = _SURROGATE.search
        if type(value) is not dict and type(value) is not list:
            return False  # a lone scalar: the exact walk is as quick
        nodes = 0
        chars = 0
        nodes_left = limits.max_json_nodes - self.nodes
        stack: list[tuple[Any, int]] = [(value, 0)]
        while stack:
            container, depth = stack.pop()
            nodes += 1
            # Checked per container (each at most max_items long): a body of millions of
            # small arrays is not walked whole before the exact walk stops it.
            if nodes > nodes_left or depth >= max_depth or len(container) > max_items:
                return False
            children = container
            if type(container) is dict:
                for key in container:
                    if not key.isascii() and surrogate(key):
                        return False
                    chars += len(key)
                children = container.values()
            for item in children:
                kind = type(item)
                if kind is str:
                    nodes += 1
                    if not item.isascii() and surrogate(item):
                        return False
                    chars += len(item)
                elif kind is dict or kind is list:
                    stack.append((item, depth + 1))
                elif kind is int:
                    nodes += 1
                    if item.bit_length() > max_bits:
                        return False
                elif kind is float:
                    nodes += 1
                    if not math.isfinite(item):
                        return False
                elif kind is bool or item is None:
                    nodes += 1
                else:
                    return False
        self.nodes += nodes
        self.chars += chars
        return nodes <= nodes_left

    def walk(self, value: Any, field: str, depth: int) -> None:
        limits = self.limits
        self.nodes += 1
        if self.nodes > limits.max_json_nodes:
            raise TooLarge(
                field, f"more than limits.max_json_nodes ({limits.max_json_nodes}) values"
            )
        if isinstance(value, str):
            check_text(value, field)
            self.chars += len(value)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidArgument(field, f"{value} is not a finite number")
        elif isinstance(value, int):
            # bit_length is O(1); count the digits only when they may be too many.
            if value.bit_length() > 3.3 * limits.max_int_digits - 4:
                digits = len(str(abs(value)))
                if digits > limits.max_int_digits:
                    raise InvalidArgument(
                        field,
                        f"an integer of {digits} digits exceeds "
                        f"limits.max_int_digits ({limits.max_int_digits})",
                    )
        elif isinstance(value, _Rejected):
            raise InvalidArgument(field, value.problem)
        elif isinstance(value, dict | list):
            if depth >= limits.max_json_depth:
                raise InvalidArgument(
                    field, f"nested deeper than limits.max_json_depth ({limits.max_json_depth})"
                )
            items = len(value)
            limit = limits.max_field_items.get(field.rsplit(".", 1)[-1], limits.max_json_items)
            if items > limit:
                name = "max_field_items" if limit != limits.max_json_items else "max_json_items"
                raise TooLarge(field, f"{items} items exceed limits.{name} ({limit})")
            if isinstance(value, dict):
                for key, item in value.items():
                    check_text(key, f"{field}.<key>")
                    self.chars += len(key)
                    self.walk(item, f"{field}.{clip(key)}" if field else clip(key), depth + 1)
            else:
                for i, item in enumerate(value):
                    self.walk(item, f"{field}[{i}]", depth + 1)
        else:  # not produced by json.loads; a caller bug, still a clear refusal
            raise InvalidArgument(field, f"unsupported value of type {type(value).__name__}")


def clip(text: str, limit: int = 100) -> str:
    """`text` shortened for an error message: a client's value echoed whole (a 100 kB env
    name) overflowed gRPC's 16 kB status-trailer limit and the client got no answer."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def check_size(actual: int, limit: int, field: str, name: str, unit: str) -> None:
    """TooLarge naming `field` and `limits.<name>` if `actual` exceeds `limit`."""
    if actual > limit:
        raise TooLarge(field, f"{actual} {unit} exceed limits.{name} ({limit})")
