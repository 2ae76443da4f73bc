"""Command-line overrides in Hydra's grammar, applied to a config tree before validation.

    key=value     set a key that exists (declared by the schema, or present in the tree);
                  unlike Hydra, an entry of a mapping field (`placement.math=thread`)
                  may be new, as rlfleet has always allowed
    +key=value    add a key that does not exist yet (error if it does)
    ++key=value   set or add
    ~key          delete (a field with a default goes back to it; a required one is then
                  reported missing by validation)
    ~key=value    delete only if the current value is `value`

Values follow Hydra's override grammar (hydra.cc, "Basic Override syntax"): `10`, `-2`,
`1_000` are ints; `3.14`, `1e-6`, `inf`, `nan` floats; `true`/`false` bools and `null`
(case-insensitive); `[a,b]` lists; `{a:1,b:2}` dicts (merged into an existing section,
as Hydra does; lists are assigned); `'...'` / `"..."` quoted strings (never converted);
anything else is a string, leading and trailing blanks dropped. `\\` escapes one of
`\\()[]{}:=, ` in an unquoted value. Not supported (each refused in one line): sweeps
(`a,b`), grammar functions (`extend_list(...)`), config groups (`db=mysql`, `a/b`, `@pkg`).
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

Op = Literal["set", "add", "force_add", "delete"]
_MISSING: Any = object()
_KEY_PART = re.compile(r"[A-Za-z0-9_\-$]+")
_INT = r"(?:0|[1-9](?:_?[0-9])*)"
_POINT = rf"(?:{_INT}\.|{_INT}?\.[0-9](?:_?[0-9])*)"
_INT_RE = re.compile(rf"[+-]?{_INT}")
_FLOAT_RE = re.compile(rf"[+-]?(?:{_POINT}|(?:{_INT}|{_POINT})[eE][+-]?{_INT}|inf|nan)", re.I)
_ESCAPABLE = set("\\()[]{}:=, \t")


class OverrideError(ValueError):
    """One override is malformed or cannot apply; the message is one line naming the key."""


@dataclass(frozen=True)
class Override:
    op: Op
    key: str
    value: Any  # _MISSING for a bare `~key`
    text: str

    @property
    def parts(self) -> list[str]:
        return self.key.split(".")


def parse_override(text: str) -> Override:
    """`+a.b=1` -> Override("add", "a.b", 1, "+a.b=1"); raises OverrideError."""
    body, op = text, "set"
    for prefix, name in (("++", "force_add"), ("+", "add"), ("~", "delete")):
        if body.startswith(prefix):
            body, op = body[len(prefix) :], name
            break
    key, sep, raw = body.partition("=")
    key = key.strip()
    if "/" in key or "@" in key:
        raise OverrideError(
            f"override {text!r}: config groups (a/b, @package) are not supported; "
            "use a dotted key, e.g. grpo.lr=1e-6"
        )
    if (not sep and op != "delete") or not key or not all(map(_KEY_PART.fullmatch, key.split("."))):
        raise OverrideError(
            f"override {text!r}: expected key=value with a dotted key, e.g. grpo.lr=1e-6 "
            "(or +key=value, ++key=value, ~key)"
        )
    if not sep:
        return Override("delete", key, _MISSING, text)
    try:
        value = parse_value(raw)
    except OverrideError as exc:
        raise OverrideError(f"{key}: {exc} (from override {text})") from None
    return Override(op, key, value, text)  # type: ignore[arg-type]


def parse_value(raw: str) -> Any:
    """A value in Hydra's grammar -> Python (see the module docstring)."""
    if not raw.strip(" \t"):
        return ""
    return _ValueParser(raw).top()


class _ValueParser:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def fail(self, why: str) -> OverrideError:
        return OverrideError(f"cannot parse value {self.s.strip()!r}: {why}")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def skip_ws(self) -> None:
        while self.peek() in (" ", "\t") and self.peek():
            self.i += 1

    def top(self) -> Any:
        value = self.element()
        self.skip_ws()
        if self.peek() == ",":
            raise self.fail(
                "a comma outside brackets is a Hydra sweep, which rlfleet does not run; "
                'use [a,b] for a list or quote the value ("a,b") for a string'
            )
        if self.peek():
            raise self.fail(f"unexpected {self.peek()!r} at position {self.i}; quote the value")
        return value

    def element(self) -> Any:
        self.skip_ws()
        if self.peek() == "[":
            return self.container("]")
        if self.peek() == "{":
            return self.container("}")
        return self.primitive(in_key=False)

    def container(self, close: str) -> Any:
        self.i += 1
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        self.skip_ws()
        if self.peek() == close:
            self.i += 1
            return items if close == "]" else pairs
        while True:
            if close == "]":
                items.append(self.element())
            else:
                key = self.primitive(in_key=True)
                self.skip_ws()
                if self.peek() != ":":
                    raise self.fail(f"expected ':' after dict key {key!r}")
                self.i += 1
                pairs[key] = self.element()
            self.skip_ws()
            if self.peek() == ",":
                self.i += 1
                continue
            if self.peek() == close:
                self.i += 1
                return items if close == "]" else pairs
            raise self.fail(f"expected ',' or {close!r} at position {self.i}")

    def primitive(self, *, in_key: bool) -> Any:
        self.skip_ws()
        if self.peek() in ("'", '"'):
            return self.quoted()
        buf: list[str] = []
        escaped = False
        stops = ",]}:" if in_key else ",]}"
        while (c := self.peek()) and c not in stops:
            if (
                c == "\\"
                and self.s[self.i + 1 : self.i + 2] in _ESCAPABLE
                and self.i + 1 < len(self.s)
            ):
                buf.append(self.s[self.i + 1])
                self.i, escaped = self.i + 2, True
                continue
            if c == "$" and self.s[self.i + 1 : self.i + 2] == "{":
                end = self.s.find("}", self.i)
                if end < 0:
                    raise self.fail("unclosed '${'")
                buf.append(self.s[self.i : end + 1])
                self.i = end + 1
                continue
            if c == "(":
                raise self.fail(
                    "grammar functions (extend_list(...), choice(...)) are not supported"
                )
            if c in "[{)=":
                raise self.fail(f"{c!r} must be escaped (\\{c}) or the value quoted")
            if c in "'\"":
                raise self.fail("a quote inside an unquoted value; quote the whole value")
            buf.append(c)
            self.i += 1
        text = "".join(buf).strip(" \t")
        if not text:
            raise self.fail(f"empty element at position {self.i}")
        return text if (escaped or in_key) else _typed(text)

    def quoted(self) -> str:
        q, j, out = self.peek(), self.i + 1, []
        while j < len(self.s):
            c = self.s[j]
            if c == "\\":
                k = j
                while k < len(self.s) and self.s[k] == "\\":
                    k += 1
                run = k - j
                if k < len(self.s) and self.s[k] == q:
                    out.append("\\" * (run // 2))
                    if run % 2:  # an escaped quote, not the closing one
                        out.append(q)
                        k += 1
                else:
                    out.append("\\" * run)
                j = k
                continue
            if c == q:
                self.i = j + 1
                self.skip_ws()
                if self.peek() and self.peek() not in ",]}:":
                    raise self.fail("text after a quoted value; quote the whole value")
                return "".join(out)
            out.append(c)
            j += 1
        raise self.fail(f"unclosed {q}")


def _typed(text: str) -> Any:
    low = text.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT_RE.fullmatch(text):
        return int(text)
    if _FLOAT_RE.fullmatch(text):
        return float(text)
    return text


# --- applying overrides to a tree, with the schema saying which keys exist ---------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _mapping_value_type(annotation: Any) -> Any:
    for candidate in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(candidate)
        if isinstance(origin, type) and issubclass(origin, Mapping):
            args = typing.get_args(candidate)
            return args[1] if len(args) == 2 else Any
    return Any


def _default_of(field: Any) -> Any:
    default = field.get_default(call_default_factory=True)
    if default is PydanticUndefined:
        return _MISSING
    return default.model_dump() if isinstance(default, BaseModel) else default


@dataclass
class _Found:
    exists: bool
    current: Any  # the tree's value, else the schema default, else _MISSING
    in_model: bool  # the parent is a declared section (its keys are fixed)
    valid: list[str]  # keys of that section (for "did you mean")
    section: bool = False  # the key itself is a section (a model), not an open mapping


def _find(model: type[BaseModel] | None, data: Mapping[str, Any], parts: list[str]) -> _Found:
    annotation: Any = model
    node: Any = data
    default: Any = _MISSING
    for part in parts:
        models = _models_in(annotation)
        field = next((m.model_fields[part] for m in models if part in m.model_fields), None)
        valid = sorted({name for m in models for name in m.model_fields})
        child = node[part] if isinstance(node, Mapping) and part in node else _MISSING
        child_default = (
            default[part] if isinstance(default, Mapping) and part in default else _MISSING
        )
        if field is not None:
            annotation = field.annotation
            if child_default is _MISSING:
                child_default = _default_of(field)
        else:
            annotation = _mapping_value_type(annotation) if not models else Any
        if child is _MISSING and child_default is _MISSING and field is None:
            return _Found(False, _MISSING, bool(models), valid)
        node, default = child, child_default
    current = node if node is not _MISSING else default
    return _Found(True, current, bool(models), valid, bool(_models_in(annotation)))


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; values in `update` win, nested dicts merge."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _put(
    data: dict[str, Any], override: Override, parts: list[str], value: Any, merge: bool = True
) -> None:
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise OverrideError(
                f"{override.key}: {where} is {child!r}, not a section (from override "
                f"{override.text})"
            )
        node = child
    old = node.get(parts[-1])
    if merge and isinstance(value, dict) and isinstance(old, dict):
        value = deep_merge(old, value)
    node[parts[-1]] = value


def _fill_defaults(model: type[BaseModel] | None, data: dict[str, Any], parts: list[str]) -> None:
    """Copy default mappings on the way to a key into the tree, so that adding one entry to
    a default mapping (`+data.env_weights.x=1`) keeps the others, as in Hydra's config."""
    import copy

    node = data
    for depth, part in enumerate(parts):
        if part not in node:
            found = _find(model, data, parts[: depth + 1])
            if not isinstance(found.current, Mapping):
                return
            # A section starts empty: its model fills the defaults, and writing them here
            # would validate defaults that pydantic never validates.
            node[part] = {} if found.section else copy.deepcopy(dict(found.current))
        node = node[part]
        if not isinstance(node, dict):
            return


def _remove(data: dict[str, Any], parts: list[str]) -> bool:
    node: Any = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and parts[-1] in node:
        del node[parts[-1]]
        return True
    return False


def _in_open_mapping(
    model: type[BaseModel] | None, data: dict[str, Any], override: Override
) -> bool:
    """The key's parent is a mapping field (`dict[str, X]`), whose keys are open."""
    if len(override.parts) < 2:
        return False
    parent = _find(model, data, override.parts[:-1])
    return parent.exists and not parent.section and isinstance(parent.current, Mapping)


def apply_override(model: type[BaseModel] | None, data: dict[str, Any], override: Override) -> None:
    """Apply one override to `data` in place; raises OverrideError (one line)."""
    found = _find(model, data, override.parts)
    key, text = override.key, override.text
    if override.op == "add" and found.exists:
        raise OverrideError(
            f"{key}: key already exists; use ++{key}={text.partition('=')[2]} to override "
            f"(from override {text})"
        )
    if override.op in ("set", "delete") and not found.exists:
        if override.op == "set" and (found.in_model or _in_open_mapping(model, data, override)):
            # In a section: validation names it with "did you mean", like every unknown
            # key. In an open mapping (`placement.math=thread`): an entry, as before Hydra.
            _fill_defaults(model, data, override.parts[:-1])
            _put(data, override, override.parts, override.value)
            return
        close = difflib.get_close_matches(override.parts[-1], found.valid, n=1)
        hint = (
            f"did you mean {'.'.join([*override.parts[:-1], close[0]])}?"
            if close
            else f"to add it use +{key}={text.partition('=')[2]}"
            if override.op == "set"
            else "nothing to delete"
        )
        raise OverrideError(f"{key}: not in the config; {hint} (from override {text})")
    if override.op != "delete":
        _fill_defaults(model, data, override.parts[:-1])
        _put(data, override, override.parts, override.value)
        return
    if override.value is not _MISSING and found.current != override.value:
        raise OverrideError(
            f"{key}: is {found.current!r}, not {override.value!r}; nothing deleted "
            f"(from override {text})"
        )
    if not _remove(data, override.parts) and not found.in_model:
        # Only in a default mapping: write the mapping without the key.
        parent = _find(model, data, override.parts[:-1]).current
        kept = {k: v for k, v in dict(parent).items() if k != override.parts[-1]}
        _put(data, override, override.parts[:-1], kept, merge=False)


def apply_overrides(
    model: type[BaseModel] | None, data: Mapping[str, Any], overrides: Iterable[str]
) -> tuple[dict[str, Any], list[str]]:
    """Apply overrides in order; returns the new tree and one error line per bad override."""
    import copy

    tree = copy.deepcopy(dict(data))
    errors = []
    for text in overrides:
        try:
            apply_override(model, tree, parse_override(text))
        except OverrideError as exc:
            errors.append(str(exc))
    return tree, errors
