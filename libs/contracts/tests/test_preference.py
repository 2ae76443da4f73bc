"""Preference pairs and the `dpo` recipe section: good rows parse, bad rows fail with the
field named, the recipe section loads with overrides and refuses IPO with label smoothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlfleet_contracts.preference import (
    PreferenceError,
    parse_preference_pair,
    read_preference_pairs,
)
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import ConfigError, load_config

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "prompt": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "chosen": [{"role": "assistant", "content": '<tool_call>{"name": "get_weather"}'}],
        "rejected": "I called lookup_climate for you.",
        "metadata": {"source": "tool_use"},
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def test_good_row_parses_and_a_string_is_one_assistant_message() -> None:
    pair = parse_preference_pair(_row())
    assert pair.tools == TOOLS and pair.metadata == {"source": "tool_use"}
    assert pair.rejected == [{"role": "assistant", "content": "I called lookup_climate for you."}]
    bare = parse_preference_pair(_row(tools=None, metadata=None))
    assert bare.tools == [] and bare.metadata == {}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"chosen": None}, "row 3: chosen: Field required"),
        ({"prompt": []}, "row 3: prompt: List should have at least 1 item"),
        ({"prompt": [{"content": "hi"}]}, "row 3: prompt: message 0 has no role"),
        ({"rejected": "  "}, "row 3: rejected: empty response"),
        (
            {"chosen": [{"role": "user", "content": "x"}]},
            "row 3: chosen: must start with an assistant message (got role 'user')",
        ),
        ({"chosen": 7}, "row 3: chosen: Input should be a valid list"),
        ({"tools": [{"type": "function"}]}, "row 3: tools: tool 0 has no function name"),
        ({"metadata": "x"}, "row 3: metadata: Input should be a valid dictionary"),
        ({"score": 1}, "row 3: score: unknown field (expected prompt, tools, chosen"),
        (
            {"rejected": [{"role": "assistant", "content": '<tool_call>{"name": "get_weather"}'}]},
            "row 3: row: chosen and rejected are identical",
        ),
    ],
)
def test_bad_rows_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(PreferenceError) as info:
        parse_preference_pair(_row(**changes), "row 3")
    assert str(info.value).startswith(message), str(info.value)


def test_a_row_that_is_not_an_object() -> None:
    with pytest.raises(
        PreferenceError, match=r"^pairs\.jsonl:2: expected a JSON object, got list$"
    ):
        parse_preference_pair([1], "pairs.jsonl:2")


def test_dpo_recipe_section() -> None:
    assert RecipeConfig().dpo.loss_type == "sigmoid" and RecipeConfig().dpo.beta == 0.1
    recipe = load_config(RecipeConfig, overrides=["dpo.loss_type=simpo", "dpo.beta=2.0"])
    assert (recipe.dpo.loss_type, recipe.dpo.beta, recipe.dpo.reference) == (
        "simpo",
        2.0,
        "precomputed",
    )
    with pytest.raises(ConfigError) as info:
        load_config(RecipeConfig, overrides=["dpo.loss_type=ipo", "dpo.label_smoothing=0.1"])
    assert "dpo.label_smoothing (0.1) has no meaning for dpo.loss_type=ipo" in str(info.value)
    with pytest.raises(ConfigError, match=r"dpo\.reference"):
        load_config(RecipeConfig, overrides=["dpo.reference=frozen"])


def test_read_pairs_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n" + json.dumps(_row(prompt=None)) + "\n")
    with pytest.raises(PreferenceError, match=r"pairs\.jsonl:3: prompt: Field required"):
        read_preference_pairs(path)
    path.write_text(json.dumps(_row()) + "\n")
    assert len(read_preference_pairs(path)) == 1
