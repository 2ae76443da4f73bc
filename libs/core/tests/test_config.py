from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import ConfigError, ConfigModel, load_config, parse_overrides


class Inner(ConfigModel):
    lr: float = 1e-3
    steps: int = Field(10, ge=1)
    name: str = "x"


class Outer(ConfigModel):
    grpo: Inner = Inner()
    enabled: bool = False
    tags: list[str] = Field(default_factory=list)
    phases: list[Inner] = Field(default_factory=list)


def test_overrides_parse_yaml_scalars_into_a_tree() -> None:
    tree = parse_overrides(["a.b=3", "a.c=true", "d=[1, 2]", "e=hello world", "f=1.5e-6", "g="])
    assert tree == {"a": {"b": 3, "c": True}, "d": [1, 2], "e": "hello world", "f": 1.5e-6, "g": ""}


def test_override_values_are_validated_by_type() -> None:
    cfg = load_config(
        Outer, overrides=["grpo.lr=1.5e-6", "grpo.steps=7", "enabled=true", "tags=[a, b]"]
    )
    assert cfg.grpo.lr == pytest.approx(1.5e-6)
    assert cfg.grpo.steps == 7
    assert cfg.enabled is True
    assert cfg.tags == ["a", "b"]


def test_bad_override_names_the_key_and_the_source() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=["grpo.lr=abc"])
    assert info.value.lines == ["grpo.lr: expected a number, got 'abc' (from override grpo.lr=abc)"]


def test_range_violation_is_reported_per_key() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=["grpo.steps=0", "enabled=maybe"])
    lines = sorted(info.value.lines)
    assert lines[0].startswith("enabled: expected true or false, got 'maybe'")
    assert lines[1].startswith("grpo.steps: input should be greater than or equal to 1, got 0")


def test_unknown_key_suggests_the_close_one() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=["grpo.lrr=1"])
    assert info.value.lines == [
        "grpo.lrr: unknown key; did you mean grpo.lr? (from override grpo.lrr=1)"
    ]


def test_unknown_key_without_a_close_match_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=["grpo.zzz=1"])
    assert (
        info.value.lines[0]
        == "grpo.zzz: unknown key; valid keys here: lr, name, steps (from override grpo.zzz=1)"
    )


def test_unknown_key_in_a_list_of_sections_is_named_with_its_index() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=["phases=[{lr: 1}, {stepz: 2}]"])
    assert info.value.lines[0].startswith(
        "phases.1.stepz: unknown key; did you mean phases.1.steps?"
    )
    with pytest.raises(ConfigError) as info:
        load_config(Outer, overrides=["phases=[{zzz: 1}]"])
    assert info.value.lines[0].startswith(
        "phases.0.zzz: unknown key; valid keys here: lr, name, steps"
    )


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1", ".a=1"])
def test_malformed_override_is_rejected(bad: str) -> None:
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides([bad])


def test_override_cannot_descend_into_a_scalar() -> None:
    with pytest.raises(ConfigError, match="already set to a value"):
        parse_overrides(["a=1", "a.b=2"])


def test_yaml_then_overrides_precedence(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("grpo:\n  lr: 0.5\n  steps: 3\nenabled: true\n")
    cfg = load_config(Outer, path, overrides=["grpo.steps=4"], base={"grpo": {"name": "base"}})
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.grpo.name, cfg.enabled) == (0.5, 4, "base", True)


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("grpo:\n  lr: 1\n   steps: [\n")
    with pytest.raises(ConfigError) as info:
        load_config(Outer, path)
    assert str(path) in info.value.lines[0]
    assert "line 3" in info.value.lines[0]


def test_missing_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Outer, tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(Outer, tmp_path / "list.yaml")


def test_recipe_cross_field_rule_says_how_to_fix() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            RecipeConfig,
            overrides=["generation.max_new_tokens=2048", "policy.max_total_sequence_length=1024"],
        )
    (line,) = info.value.lines
    assert "generation.max_new_tokens (2048)" in line
    assert "policy.max_total_sequence_length (1024)" in line


def test_recipe_fields_are_documented() -> None:
    # use_attribute_docstrings: the docstring under each field is its description.
    fields = RecipeConfig.model_fields["grpo"].annotation.model_fields  # type: ignore[union-attr]
    assert "leave-one-out" in (fields["normalize_rewards"].description or "")
    assert fields["ratio_clip_max"].default == 0.28
