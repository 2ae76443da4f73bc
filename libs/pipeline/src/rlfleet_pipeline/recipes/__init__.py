"""Bundled stage recipes: `super3/rlvr1`, `super3/swe1`, `nano3/grpo`, `test`, ...

A recipe file states only what differs from the defaults of `RecipeConfig`; `base:` names
another recipe file (relative to this one) whose settings it starts from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import ConfigError, deep_merge, load_config, read_yaml

RECIPES_DIR = Path(__file__).resolve().parent


def bundled_recipes() -> list[str]:
    return sorted(
        str(p.relative_to(RECIPES_DIR).with_suffix("")) for p in RECIPES_DIR.rglob("*.yaml")
    )


def resolve_recipe(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    bundled = RECIPES_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if bundled.is_file():
        return bundled
    raise ConfigError(
        [
            f"-c {name_or_path}: no such file and no bundled recipe of that name "
            f"(bundled: {', '.join(bundled_recipes())})"
        ]
    )


def read_recipe(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The recipe's settings with its `base:` chain merged in (the file itself wins)."""
    if path.resolve() in _seen:
        raise ConfigError([f"{path}: `base:` chain loops back to itself"])
    data = read_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError([f"{path}: base: expected a recipe file name, got {base!r}"])
    return deep_merge(read_recipe(path.parent / base, (*_seen, path.resolve())), data)


def load_recipe(name_or_path: str, overrides: Sequence[str] = ()) -> RecipeConfig:
    path = resolve_recipe(name_or_path)
    return load_config(RecipeConfig, base=read_recipe(path), overrides=overrides)
