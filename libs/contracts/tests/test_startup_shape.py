"""The megatron backend's TP/PP split of the model, checked from its config.json by the
same function at start and in `rlfleet rl --dry-run` (a 2x H100 run found TP=2 refused
only once the ranks were up: SmolLM2-135M has 9 attention heads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.startup import StartupError, check_model_shape, start_problem
from rlfleet_core.config import load_config


@pytest.mark.parametrize(
    ("heads", "kv", "layers", "tp", "pp", "wanted"),
    [
        (8, 4, 30, 2, 1, None),
        (8, 4, 30, 2, 3, None),
        (9, 3, 30, 2, 1, "policy.tensor_parallel_size=2 must divide the model's 9 attention"),
        (8, 2, 30, 4, 1, "and 2 key/value heads"),
        (8, 4, 30, 1, 4, "policy.pipeline_parallel_size=4 must divide the model's 30 decoder"),
    ],
)
def test_model_shape_against_tp_and_pp(
    heads: int, kv: int, layers: int, tp: int, pp: int, wanted: str | None
) -> None:
    if wanted is None:
        check_model_shape(heads, kv, layers, tp, pp)
        return
    with pytest.raises(StartupError, match=wanted.replace("(", r"\(")):
        check_model_shape(heads, kv, layers, tp, pp)


def _model(root: Path, heads: int, kv: int, layers: int) -> Path:
    root.mkdir()
    config = {"num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": layers}
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_start_checks_the_model_folder_shape_for_megatron(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    model = _model(tmp_path / "m9", 9, 3, 30)
    base = [f"policy.model={model}", f"data.train_path={rows}", "policy.tensor_parallel_size=2"]
    megatron = load_config(RecipeConfig, overrides=[*base, "policy.backend=megatron"])
    problem = start_problem(megatron, world_size=2)
    assert problem is not None and "must divide the model's 9 attention heads" in problem
    fine = _model(tmp_path / "m8", 8, 4, 30)
    ok = load_config(
        RecipeConfig,
        overrides=[*base, "policy.backend=megatron", f"policy.model={fine}"],
    )
    assert start_problem(ok, world_size=2) is None


def test_router_balancing_on_a_model_without_routers_fails_the_start_checks(
    tmp_path: Path,
) -> None:
    """`policy.moe.router_bias_update_rate` on a dense model is refused by --dry-run, as
    the torch backend would refuse it once the model is loaded; on Nemotron-H with MoE
    layers it passes."""
    from rlfleet_core.models import resolve_model

    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")

    def problem(model: Path | str) -> str | None:
        recipe = load_config(
            RecipeConfig,
            overrides=[
                f"policy.model={model}",
                f"data.train_path={rows}",
                "policy.moe.router_bias_update_rate=0.001",
            ],
        )
        return start_problem(recipe, 1)

    dense = problem(resolve_model("tiny"))
    assert dense is not None and dense.startswith("policy.moe.router_bias_update_rate=0.001")
    assert "(qwen2) has no mixture-of-experts router" in dense
    assert problem(resolve_model("tiny-nemotron-h")) is None
