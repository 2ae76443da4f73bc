"""Stage SWE2's recipes and wiring: the published multi_turn settings in super3/swe2, the
tiny recipe's chain and limits, the reward gateway told where the swe-runner is and given
episode limits that fit the trainer's deadlines, and the preflight naming unbuilt
instance images (with how to build them)."""

from __future__ import annotations

import json
from pathlib import Path

from rlfleet_pipeline.fleet import wiring
from rlfleet_pipeline.preflight import local_overrides, swe_image_problem, wiring_problem
from rlfleet_pipeline.recipes import load_recipe
from rlfleet_pipeline.stage import stage_services


def test_super3_swe2_has_the_published_agent_settings() -> None:
    recipe = load_recipe("super3/swe2")
    mt = recipe.multi_turn
    assert (mt.envs, mt.max_turns, mt.max_trajectory_time_s) == (["swe_agent"], 100, 1800.0)
    assert mt.step_timeout_s >= 1200  # CloseEpisode runs the tests (900-1200 s published)
    assert recipe.grpo.overlong_filtering and recipe.policy.model == "runs/swe1/hf"


def test_tiny_swe2_chains_and_stays_small() -> None:
    recipe = load_recipe("tiny/swe2")
    assert recipe.stage == "swe2" and recipe.policy.model == "runs/swe1/hf"
    assert recipe.multi_turn.envs == ["swe_agent"] and recipe.multi_turn.max_turns <= 5
    assert recipe.grpo.overlong_filtering and recipe.policy.dtype == "float32"
    assert recipe.data.train_path == "data/tiny-swe2/train/data.jsonl"


def test_the_reward_gateway_is_wired_to_the_swe_runner() -> None:
    recipe = load_recipe("tiny/swe2")
    services = stage_services(recipe)
    assert "swe-runner" in services
    wired = wiring("reward", services, lambda s: f"{s}:1")
    assert "swe.target=swe-runner:1" in wired and "sandbox.target=sandbox:1" in wired
    plan = local_overrides(recipe, "hf")
    assert "episodes.tool_timeout_s=115" in plan["reward"]  # step_timeout_s 120 - 5
    assert "episodes.close_timeout_s=115" in plan["reward"]
    assert wiring_problem(recipe, plan) is None
    big = local_overrides(load_recipe("super3/swe2"), "vllm")["reward"]
    assert "episodes.tool_timeout_s=600" in big and "episodes.close_timeout_s=1255" in big
    unwired = {**plan, "reward": [o for o in plan["reward"] if not o.startswith("swe.")]}
    problem = wiring_problem(recipe, unwired)
    assert problem is not None and "no swe.target" in problem


def test_preflight_names_unbuilt_instance_images(tmp_path: Path) -> None:
    rows = tmp_path / "train.jsonl"
    row = {"agent_ref": {"name": "swe_agent"}, "image": "rlfleet/swe-tiny:never-built-x1"}
    rows.write_text(json.dumps(row) + "\n")
    recipe = load_recipe("tiny/swe2", [f"data.train_path={rows}", "data.val_path=null"])
    problem = swe_image_problem(recipe)
    assert problem is not None
    assert "rlfleet/swe-tiny:never-built-x1" in problem and "rlfleet_swe.images" in problem
