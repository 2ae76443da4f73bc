"""Hydra's override grammar (`key=v`, `+key=v`, `++key=v`, `~key`, `~key=v`) on top of the
pydantic validation of rlfleet_core.config: a table of values, then each operation's rules
and its one-line errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, field_validator
from rlfleet_core.config import ConfigError, ConfigModel, format_override, load_config
from rlfleet_core.override_values import format_value, quote_value
from rlfleet_core.overrides import OverrideError, parse_override, parse_value


class Inner(ConfigModel):
    lr: float = 1e-3
    steps: int = Field(10, ge=1)
    name: str = "x"


class Outer(ConfigModel):
    model: str
    """Required: no default."""
    grpo: Inner = Inner()
    extra: dict[str, Any] = Field(default_factory=dict)
    weights: dict[str, float] = Field(default_factory=lambda: {"math": 1.0, "code": 2.0})
    tags: list[str] = Field(default_factory=list)
    maybe: Inner | None = None


BASE = {"model": "m"}


def load(*overrides: str, base: dict[str, Any] | None = None) -> Outer:
    return load_config(Outer, overrides=list(overrides), base=base or BASE)


def errors(*overrides: str, base: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(*overrides, base=base)
    return info.value.lines


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("10", 10),
        ("-20", -20),
        ("1_000_000", 1_000_000),
        ("3.14", 3.14),
        ("-10e3", -10e3),
        ("1e-6", 1e-6),
        ("1.5e-6", 1.5e-6),
        ("true", True),
        ("TrUe", True),
        ("False", False),
        ("null", None),
        ("NULL", None),
        ("", ""),
        ("  hello world  ", "hello world"),
        ("foo-bar_10", "foo-bar_10"),
        ("127.0.0.1", "127.0.0.1"),
        ("http://host:8000/v1", "http://host:8000/v1"),
        ("/runs/a b/data.jsonl", "/runs/a b/data.jsonl"),
        ("007", "007"),  # Hydra's ints have no leading zeros
        ("yes", "yes"),  # YAML 1.1 would say True; Hydra says a string
        ("'hello there'", "hello there"),
        ('"1,2,3"', "1,2,3"),
        ('"10"', "10"),  # quoted: never converted
        ("'escaped \\'single\\''", "escaped 'single'"),
        ('"{a:10} ${xyz}"', "{a:10} ${xyz}"),
        ("job\\{a\\=1\\,b\\=2\\}", "job{a=1,b=2}"),
        ("${policy.model}", "${policy.model}"),
        ("[]", []),
        ("[1,2,3]", [1, 2, 3]),
        ("[a, [b, [c]]]", ["a", ["b", ["c"]]]),
        ('["/a", "/b c"]', ["/a", "/b c"]),
        ("{}", {}),
        ("{a:10,b:20}", {"a": 10, "b": 20}),
        ("{a: 10, b: {c: 30, d: x y}}", {"a": 10, "b": {"c": 30, "d": "x y"}}),
        ("{1: a}", {"1": "a"}),  # keys stay strings: rlfleet's mappings are keyed by name
    ],
)
def test_values_parse_as_hydra_does(raw: str, value: Any) -> None:
    assert parse_value(raw) == value
    assert type(parse_value(raw)) is type(value)


def test_special_floats() -> None:
    assert parse_value("inf") == math.inf
    assert parse_value("-inf") == -math.inf
    assert math.isnan(parse_value("nan"))


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("a,b", "a comma outside brackets is a Hydra sweep"),
        ("extend_list(1)", "grammar functions"),
        ("[1,2", "expected ',' or ']'"),
        ("{a 1}", "expected ':' after dict key"),
        ("a=b", "'=' must be escaped"),
        ("A[B", "'[' must be escaped"),
        ('"x"y', "text after a quoted value"),
        ("'open", "unclosed '"),
        ("[a,,b]", "empty element"),
    ],
)
def test_bad_values_say_why(raw: str, why: str) -> None:
    with pytest.raises(OverrideError, match="cannot parse value") as info:
        parse_value(raw)
    assert why in str(info.value)


@pytest.mark.parametrize(
    ("text", "op", "key"),
    [
        ("a.b=1", "set", "a.b"),
        ("+a.b=1", "add", "a.b"),
        ("++a.b=1", "force_add", "a.b"),
        ("~a.b", "delete", "a.b"),
        ("~a.b=1", "delete", "a.b"),
        ("+a.b=", "add", "a.b"),
    ],
)
def test_override_forms(text: str, op: str, key: str) -> None:
    parsed = parse_override(text)
    assert (parsed.op, parsed.key) == (op, key)


@pytest.mark.parametrize("bad", ["novalue", "+novalue", "=3", "a..b=1", ".a=1", "~", "a b=1"])
def test_malformed_overrides(bad: str) -> None:
    with pytest.raises(OverrideError, match="expected key=value with a dotted key"):
        parse_override(bad)


@pytest.mark.parametrize("bad", ["db/mysql=x", "db@pkg=x"])
def test_config_groups_are_refused(bad: str) -> None:
    with pytest.raises(OverrideError, match="config groups"):
        parse_override(bad)


def test_set_needs_an_existing_key() -> None:
    cfg = load("grpo.lr=0.5", "grpo.steps=3", "maybe.lr=0.25", "weights.math=3")
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.maybe, cfg.weights["math"]) == (
        0.5,
        3,
        Inner(lr=0.25),
        3.0,
    )
    assert errors("grpo.lrr=1") == [
        "grpo.lrr: unknown key; did you mean grpo.lr? (from override grpo.lrr=1)"
    ]
    # Unlike Hydra, an open mapping takes new entries with key=v (rlfleet always has).
    assert load("extra.k=1", "weights.mcqa=2").extra == {"k": 1}
    assert load("weights.mcqa=2").weights == {"math": 1.0, "code": 2.0, "mcqa": 2.0}
    assert errors("grpo.name.x=1")[0] == (
        "grpo.name.x: not in the config; to add it use +grpo.name.x=1 (from override grpo.name.x=1)"
    )


def test_add_needs_a_new_key() -> None:
    cfg = load("+extra.k=1", "+extra.nested.deep=[a,b]", "+weights.mcqa=0.5")
    assert cfg.extra == {"k": 1, "nested": {"deep": ["a", "b"]}}
    assert cfg.weights == {"math": 1.0, "code": 2.0, "mcqa": 0.5}
    assert errors("+grpo.lr=1e-6") == [
        "grpo.lr: key already exists; use ++grpo.lr=1e-6 to override (from override +grpo.lr=1e-6)"
    ]
    assert errors("+extra.k=2", base={**BASE, "extra": {"k": 1}})[0].startswith(
        "extra.k: key already exists; use ++extra.k=2"
    )
    # Adding to a section with fixed keys is still an unknown key.
    assert errors("+grpo.lrr=1") == [
        "grpo.lrr: unknown key; did you mean grpo.lr? (from override +grpo.lrr=1)"
    ]


def test_force_add_sets_or_adds() -> None:
    cfg = load("++grpo.lr=0.5", "++extra.k=1", "++extra.k=2")
    assert (cfg.grpo.lr, cfg.extra) == (0.5, {"k": 2})


def test_delete() -> None:
    base = {**BASE, "grpo": {"lr": 0.5, "steps": 3}, "extra": {"a": 1, "b": 2}}
    cfg = load("~grpo.lr", "~extra.a", "~grpo.steps=3", base=base)
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.extra) == (1e-3, 10, {"b": 2})
    # A key only in a default mapping: the mapping is kept without it.
    assert load("~weights.code").weights == {"math": 1.0}
    # A field at its default: deleting leaves it there.
    assert load("~grpo.name").grpo.name == "x"
    assert errors("~grpo.lr=0.1", base=base) == [
        "grpo.lr: is 0.5, not 0.1; nothing deleted (from override ~grpo.lr=0.1)"
    ]
    assert errors("~grpo.lrr") == [
        "grpo.lrr: not in the config; did you mean grpo.lr? (from override ~grpo.lrr)"
    ]
    assert errors("~extra.zzz") == [
        "extra.zzz: not in the config; nothing to delete (from override ~extra.zzz)"
    ]


def test_deleting_a_required_key_is_the_validation_error_naming_it() -> None:
    assert errors("~model") == ["model: required, but not set (from override ~model)"]


def test_dicts_merge_and_lists_are_assigned() -> None:
    base = {**BASE, "grpo": {"lr": 0.5}, "tags": ["a", "b"]}
    cfg = load("grpo={steps: 4}", "tags=[c]", base=base)
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.tags) == (0.5, 4, ["c"])


def test_overrides_apply_in_order() -> None:
    assert load("grpo.lr=0.1", "~grpo.lr", "grpo.lr=0.2").grpo.lr == 0.2
    assert errors("~grpo", "+grpo.lr=1")[0].startswith("grpo.lr: key already exists")


def test_every_bad_override_is_reported_on_its_own_line() -> None:
    assert errors("~extra.a", "a,b=", "grpo.lr=x,y") == [
        "extra.a: not in the config; nothing to delete (from override ~extra.a)",
        "override 'a,b=': expected key=value with a dotted key, e.g. grpo.lr=1e-6 "
        "(or +key=value, ++key=value, ~key)",
        "grpo.lr: cannot parse value 'x,y': a comma outside brackets is a Hydra sweep, which "
        'rlfleet does not run; use [a,b] for a list or quote the value ("a,b") for a string '
        "(from override grpo.lr=x,y)",
    ]


def test_type_errors_name_the_key_and_the_prefixed_override() -> None:
    assert errors("++grpo.lr=abc") == [
        "grpo.lr: expected a number, got 'abc' (from override ++grpo.lr=abc)"
    ]


def test_descending_into_a_value_is_refused() -> None:
    assert errors("grpo.name.x=1")[0].startswith("grpo.name.x: not in the config")
    assert errors("+extra.a=1", "+extra.a.b=2") == [
        "extra.a.b: extra.a is 1, not a section (from override +extra.a.b=2)"
    ]


@pytest.mark.parametrize(
    "value", ["plain", "a b", "x,y", "[bracket]", 'q"uote', "it's", "end\\", "12", "null", ""]
)
def test_quote_value_round_trips(value: str) -> None:
    assert parse_value(quote_value(value)) == value


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0.3,
        -2,
        '{"score_1": ',
        ["a, b", 1, False],
        {"general": "Judge: be fair, [brief]", "math": 'x"y', "n": {"k": [1.5]}},
    ],
)
def test_format_value_round_trips_recipe_values(value: object) -> None:
    """What the launcher writes from a recipe section (judge.genrm.*) parses back intact."""
    assert parse_value(format_value(value)) == value


def test_paths_with_special_characters_survive_format_override(tmp_path: Path) -> None:
    odd = tmp_path / "run (1), [copy]"
    cfg = load(format_override("model", odd))
    assert cfg.model == str(odd)


class WithMap(ConfigModel):
    weights: dict[str, float] = Field(default_factory=lambda: {"math": 1.0})


class Holder(ConfigModel):
    inner: WithMap = WithMap()


def test_adding_to_a_default_mapping_inside_an_unset_section_keeps_its_entries() -> None:
    cfg = load_config(Holder, overrides=["+inner.weights.mcqa=0.5"])
    assert cfg.inner.weights == {"math": 1.0, "mcqa": 0.5}


class Checked(ConfigModel):
    name: str = ""
    """A default the validator would refuse: pydantic never validates defaults."""
    other: int = 0

    @field_validator("name")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        return value


class HasChecked(ConfigModel):
    checked: Checked = Checked()


def test_setting_one_key_does_not_validate_the_sections_other_defaults() -> None:
    assert load_config(HasChecked, overrides=["checked.other=3"]).checked.other == 3
