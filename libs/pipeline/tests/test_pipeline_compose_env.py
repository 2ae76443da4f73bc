"""`rlfleet run --run compose`'s variables for compose.yaml, per stage of the tiny
pipeline (rlfleet_pipeline.pipeline_compose.stage_compose_env), without Docker."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from rlfleet_pipeline.pipeline import data_dir, stage_recipe
from rlfleet_pipeline.pipeline_compose import COMPOSE_TRANSPORT, stage_compose_env
from rlfleet_pipeline.pipelines import TINY

ROLLOUT_VARS = ("ROLLOUT_ENGINE", "ROLLOUT_MODEL", "ROLLOUT_OVERRIDES")


def test_each_stage_keeps_the_rollout_and_wires_its_own_services(tmp_path: Path) -> None:
    pipeline = replace(TINY, model="tiny")
    recipes = [
        stage_recipe(pipeline, i, tmp_path, data_dir(tmp_path, stage), [COMPOSE_TRANSPORT])
        for i, stage in enumerate(pipeline.stages)
    ]
    rollout = pipeline.shared_rollout(recipes)
    envs = {
        stage.name: stage_compose_env(recipe, pipeline, "hf", {"KEPT": "1"}, rollout)
        for stage, recipe in zip(pipeline.stages, recipes, strict=True)
    }
    # One rollout container for the whole run: its variables never change (no recreate),
    # it serves the pipeline's bundled start, at the longest stage's length (swe2's).
    rollouts = {tuple(env[v] for v in ROLLOUT_VARS) for env in envs.values()}
    assert rollouts == {("hf", "tiny", json.dumps(["engine_config.max_model_len=2048"]))}
    assert all(env["KEPT"] == "1" for env in envs.values())
    assert envs["rlvr1"]["REWARD_SANDBOX_TARGET"] == "sandbox:50051"
    assert envs["swe2"]["REWARD_SWE_TARGET"] == "swe-runner:50051"
    assert envs["rlvr1"]["REWARD_SWE_TARGET"] == envs["swe1"]["REWARD_SANDBOX_TARGET"] == ""
    # Only rlhf starts the judge (its profile) and gives the gateway its address.
    judged = [name for name, env in envs.items() if env.get("COMPOSE_PROFILES") == "judge"]
    assert judged == ["rlhf"]
    assert "judge.base_url=http://judge:8000/v1" in json.loads(envs["rlhf"]["REWARD_OVERRIDES"])
