"""Typed configuration: pydantic models loaded from YAML plus overrides in Hydra's grammar
(`key=value`, `+key=value`, `++key=value`, `~key`; rlfleet_core.overrides).

Every config section subclasses `ConfigModel`: unknown keys are errors (a misspelled key
must not pass silently), each field is documented by the docstring under it, and bad
values produce one line per problem naming the dotted key, e.g.

    grpo.lr: expected a number, got 'abc' (from override grpo.lr=abc)
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from rlfleet_core.override_values import format_override, format_value
from rlfleet_core.overrides import (
    OverrideError,
    apply_overrides,
    deep_merge,
    parse_override,
)

__all__ = [
    "ConfigError",
    "ConfigModel",
    "deep_merge",
    "dump_yaml",
    "env_overrides",
    "format_override",
    "format_validation_error",
    "format_value",
    "load_config",
    "load_service_config",
    "overrides_variable",
    "parse_overrides",
    "read_yaml",
]

if TYPE_CHECKING:  # the loader reads a definition's name and config model only
    from collections.abc import Sequence

    from rlfleet_core.server import ServiceConfig, ServiceDefinition

M = TypeVar("M", bound=BaseModel)


class ConfigModel(BaseModel):
    """Base of every config section: strict keys, documented fields, checked assignment."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )


class ConfigError(ValueError):
    """A config could not be loaded; `lines` holds one human-readable problem each."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn plain ["a.b=1", "c=x"] into {"a": {"b": 1}, "c": "x"} (no schema: every key is
    taken as given; `+`, `++` and `~` need one, so they go through `load_config`).

    Values follow Hydra's grammar (rlfleet_core.overrides): `3` is an int, `true` a bool,
    `[1,2]` a list, `{a:1}` a dict, `'...'` a string, anything else a string.
    """
    tree: dict[str, Any] = {}
    for item in overrides:
        try:
            override = parse_override(item)
        except OverrideError as exc:
            raise ConfigError([str(exc)]) from None
        if override.op != "set":
            raise ConfigError(
                [f"override {item!r}: +, ++ and ~ need the config's schema; use load_config"]
            )
        node = tree
        parts = override.parts
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(
                    [f"override {item!r}: {part!r} was already set to a value, not a section"]
                )
            node = child
        node[parts[-1]] = override.value
    return tree


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" line {mark.line + 1}, column {mark.column + 1}:"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{path}:{where} invalid YAML ({problem})"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}"]
        )
    return data


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Iterable[str] = (),
    base: Mapping[str, Any] | None = None,
) -> M:
    """Build `model` from `base` ← YAML at `path` ← `overrides`, applied in order (Hydra's
    grammar: `key=v` must exist, `+key=v` must not, `++key=v` either, `~key` deletes)."""
    data: dict[str, Any] = dict(base or {})
    if path is not None:
        data = deep_merge(data, read_yaml(path))
    overrides = list(overrides)
    data, problems = apply_overrides(model, data, overrides)
    if problems:
        raise ConfigError(problems)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, model, overrides)) from None


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Valid keys of the section that `loc` points into (for 'did you mean')."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list of sections: list[Section]
            args = typing.get_args(current)
            if not args:
                return []
            current = args[0]
            continue
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else []


_TYPE_WORDS = {
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a section (mapping of keys)",
    "model_type": "expected a section (mapping of keys)",
    "list_type": "expected a list",
}


def format_validation_error(
    exc: ValidationError, model: type[BaseModel], overrides: Iterable[str] = ()
) -> list[str]:
    """One line per problem: `dotted.key: what is wrong, got X (from override ...)`."""
    override_keys = {o.partition("=")[0].strip().lstrip("+~"): o for o in overrides}
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "<top level>"
        kind = err["type"]
        if kind == "extra_forbidden":
            valid = _field_names(model, loc)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            suggestion = ".".join([*map(str, loc[:-1]), close[0]]) if close else ""
            hint = (
                f"did you mean {suggestion}?" if close else f"valid keys here: {', '.join(valid)}"
            )
            line = f"{key}: unknown key; {hint}"
        elif kind == "missing":
            line = f"{key}: required, but not set"
        elif kind == "value_error":  # our own validators: the message says it all
            what = str(err.get("ctx", {}).get("error", err["msg"]))
            line = f"{key}: {what}" if loc else what
        else:
            what = _TYPE_WORDS.get(kind) or err["msg"][:1].lower() + err["msg"][1:]
            line = f"{key}: {what}, got {err['input']!r}"
        if key in override_keys:
            line += f" (from override {override_keys[key]})"
        lines.append(line)
    return lines


def dump_yaml(model: BaseModel) -> str:
    """The fully resolved config as YAML (defaults included), for --dry-run and lineage."""
    return yaml.safe_dump(model.model_dump(mode="json"), sort_keys=False)


def overrides_variable(service: str) -> str:
    """The environment variable holding extra overrides of `service` (a JSON list of
    `key=value` strings): how a container launcher (compose) passes a stage's settings,
    which a fixed `command:` cannot carry. `rlfleet-reward` reads RLFLEET_REWARD_OVERRIDES."""
    return f"RLFLEET_{service.upper().replace('-', '_')}_OVERRIDES"


def env_overrides(service: str) -> list[str]:
    """The overrides in `overrides_variable(service)` ([] when unset or empty)."""
    name = overrides_variable(service)
    raw = os.environ.get(name, "").strip()
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        message = f"{name}: not JSON ({exc.msg}); expected a list of key=value strings"
        raise ConfigError([message]) from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError([f"{name}: expected a JSON list of key=value strings"])
    return value


def load_service_config(
    definition: ServiceDefinition,
    config_path: str | Path | None,
    overrides: Sequence[str],
    port: int | None = None,
    http_port: int | None = None,
    host: str | None = None,
    port_file: str | None = None,
) -> ServiceConfig:
    """Config from YAML, then the overrides in RLFLEET_<SERVICE>_OVERRIDES (env_overrides),
    then `overrides`, with --port/--http-port/--host/--port-file winning."""
    flags = []
    if port is not None:
        flags.append(f"server.port={port}")
    if http_port is not None:
        flags.append(f"server.http_port={http_port}")
    if host is not None:
        flags.append(format_override("server.host", host))
    if port_file is not None:
        flags.append(format_override("server.port_file", port_file))
    applied = [*env_overrides(definition.name), *overrides, *flags]
    return load_config(definition.config_model, config_path, applied)
