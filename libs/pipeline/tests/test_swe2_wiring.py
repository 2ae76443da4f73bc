"""Stage SWE2's recipes and wiring: the published multi_turn settings in super3/swe2, the
tiny recipe's chain and limits, the reward gateway told where the swe-runner is and given
episode limits that fit the trainer's deadlines, and the preflight naming unbuilt
instance images (with how to build them); the services a swe stage starts follow its
environments, and the compose file and the sbatch script wire the swe-runner too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_pipeline.fleet import wiring
from rlfleet_pipeline.launch.profiles import ComposeProfile, SlurmProfile
from rlfleet_pipeline.launchers import (
    compose_overrides,
    launch_plan,
    local_overrides,
    planned_overrides,
)
from rlfleet_pipeline.preflight import (
    service_problem,
    swe_image_problem,
    wiring_problem,
)
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
    assert wired == ["swe.target=swe-runner:1"]  # swe_agent needs no sandbox
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


def test_a_stage_starts_what_its_environments_need() -> None:
    """SWE1 (swe_pivot: a comparison) needs only reward + rollout; SWE2 (swe_agent) the
    swe-runner and no sandbox; an swe stage with another environment keeps the sandbox."""
    assert stage_services(load_recipe("tiny/swe1")) == ["reward", "rollout"]
    assert stage_services(load_recipe("super3/swe1")) == ["reward", "rollout"]
    assert stage_services(load_recipe("tiny/swe2")) == ["reward", "rollout", "swe-runner"]
    assert stage_services(load_recipe("super3/swe2")) == ["reward", "rollout", "swe-runner"]
    mixed = load_recipe("tiny/swe1", ["data.default_env=code"])
    assert stage_services(mixed) == ["sandbox", "reward", "rollout"]
    assert stage_services(load_recipe("test")) == ["sandbox", "reward", "rollout"]  # rlvr
    plan = local_overrides(load_recipe("tiny/swe1"), "hf")
    assert sorted(plan) == ["reward", "rollout"]
    assert wiring_problem(load_recipe("tiny/swe1"), plan) is None


def test_compose_gives_the_reward_gateway_the_swe_runner() -> None:
    """What `rlfleet rl swe --run compose` passes the reward container (read from
    deploy/compose/compose.yaml with the variables the launcher sets)."""
    swe2 = load_recipe("tiny/swe2", ["policy.model=tiny"])
    plan = compose_overrides(swe2, ComposeProfile(), "hf")
    assert sorted(plan) == ["reward", "rollout", "swe-runner"]
    assert "swe.target=swe-runner:50051" in plan["reward"]
    assert "sandbox.target=" in plan["reward"]  # no sandbox in this stage: unset
    # the episode limits that fit the trainer's deadlines reach the container too
    # (REWARD_OVERRIDES; before, only the local fleet passed them)
    assert any(o.startswith("episodes.tool_timeout_s=") for o in plan["reward"])
    assert wiring_problem(swe2, plan) is None
    assert service_problem("reward", plan["reward"], installed_only=False) is None
    rlvr = compose_overrides(load_recipe("test", ["policy.model=tiny"]), ComposeProfile(), "hf")
    assert "sandbox.target=sandbox:50051" in rlvr["reward"] and "swe.target=" in rlvr["reward"]
    dry = launch_plan(swe2, ComposeProfile(project_name="p"), Path("runs/swe2"), "hf")
    up = dry.splitlines()[0]
    assert "REWARD_SWE_TARGET=swe-runner:50051" in up and "REWARD_SANDBOX_TARGET='' " in up
    assert up.endswith("up -d --no-deps --wait --wait-timeout 600 reward rollout swe-runner")


def test_slurm_gives_the_reward_gateway_the_swe_runner(tmp_path: Path) -> None:
    profile = SlurmProfile.model_validate(
        {"partition": "cpu", "nodes": {"sandbox": 0, "swe_runner": 1}, "job_dir": "/jobs",
         "container_runtime": "none"}
    )  # fmt: skip
    swe2 = load_recipe("tiny/swe2")
    plan = planned_overrides(swe2, profile, tmp_path, "hf")
    assert plan["reward"][0] == "swe.target=$SWE_RUNNER_TARGET"
    assert not any(o.startswith("sandbox.target") for o in plan["reward"])
    assert wiring_problem(swe2, plan) is None
    script = launch_plan(swe2, profile, tmp_path, "hf")
    # The gateway (component 2) starts once the swe-runner has published its address.
    assert "\nwait_for SWE_RUNNER_TARGET\nsrun --het-group=2 " in script
    assert '"swe.target=$SWE_RUNNER_TARGET"' in script.split("srun --het-group=2 ")[1]
    both = SlurmProfile.model_validate({**profile.model_dump(), "nodes": {"swe_runner": 1}})
    rlvr_like = load_recipe("tiny/swe2", ["data.env_weights={swe_agent: 1, code: 1}"])
    script = launch_plan(rlvr_like, both, tmp_path, "hf")
    assert "wait_for SANDBOX_TARGET SWE_RUNNER_TARGET" in script


def test_a_wrong_kind_suggests_the_right_command() -> None:
    """`rlfleet rl swe -c tiny/tooluse` suggested `rlfleet rl rlvr-tooluse` (the stage name
    with digits stripped), which is no command: the kind is the name's prefix."""
    from rlfleet_pipeline.recipes import load_recipe
    from rlfleet_pipeline.stage import StageError, check_stage

    with pytest.raises(StageError, match=r"use `rlfleet rl rlvr -c tiny/tooluse`"):
        check_stage("swe", load_recipe("tiny/tooluse"), "tiny/tooluse")
    with pytest.raises(StageError, match=r"use `rlfleet rl swe -c tiny/swe2`"):
        check_stage("rlvr", load_recipe("tiny/swe2"), "tiny/swe2")
