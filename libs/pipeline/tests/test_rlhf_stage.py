"""The RLHF stage's recipes and its judge: KL 1e-4 and overlong filtering off in both
recipes, the judge section turned into a second rollout service (`judge`) that only the
local fleet starts and whose HTTP face is the reward gateway's `judge.base_url`, an
external endpoint passed through instead, and the preflight naming a genrm stage with no
judge. The real fleet test starts the judge and the gateway and sees the gateway's
comparisons arrive at the judge."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from rlfleet_pipeline.fleet import LocalFleet, wiring
from rlfleet_pipeline.launch.profiles import LocalProfile, SlurmProfile
from rlfleet_pipeline.launchers import launch_plan, local_overrides, planned_overrides
from rlfleet_pipeline.preflight import (
    service_problem,
    wiring_problem,
)
from rlfleet_pipeline.recipes import load_recipe
from rlfleet_pipeline.stage import local_services, stage_services


@pytest.mark.parametrize("name", ["tiny/rlhf", "super3/rlhf"])
def test_rlhf_recipes_have_kl_a_judge_and_no_overlong_filter(name: str) -> None:
    recipe = load_recipe(name)
    assert recipe.stage == "rlhf" and recipe.grpo.kl_coef == pytest.approx(1e-4)
    assert recipe.grpo.overlong_filtering is False
    assert recipe.data.default_env == "genrm_compare"
    assert recipe.judge.served and recipe.judge.model
    assert stage_services(recipe) == ["reward", "rollout"]  # what SLURM and compose start
    assert local_services(recipe) == ["reward", "rollout", "judge"]


def test_tiny_rlhf_chains_and_judges_with_smollm2() -> None:
    recipe = load_recipe("tiny/rlhf")
    assert recipe.policy.model == "runs/rlvr3/hf"
    assert recipe.data.train_path == "data/tiny-rlhf/train/data.jsonl"
    assert (recipe.judge.model, recipe.judge.engine) == ("smollm2-135m-instruct", "hf")


def test_super3_rlhf_gives_the_gateway_the_seeds_genrm_settings() -> None:
    plan = local_overrides(load_recipe("super3/rlhf"), "vllm")
    for item in (
        "judge.temperature=0.6",
        "judge.top_p=0.95",
        "judge.max_tokens=16384",
        "genrm.comparison_strategy=circular",
        "judge.prefill=false",
        "genrm.reasoning_bonus=0.5",
        "genrm.group_answer_length_penalty_coeff=0.35",
        "genrm.group_style_penalty_coeff=0.05",
    ):
        assert item in plan["reward"], item
    assert service_problem("reward", plan["reward"], installed_only=True) is None
    assert "model=nvidia/Qwen3-Nemotron-235B-A22B-GenRM" in plan["judge"]


def test_the_reward_gateway_is_wired_to_the_judges_http_face() -> None:
    services = ["reward", "rollout", "judge"]
    wired = wiring("reward", services, lambda s: f"{s}:1", lambda s: f"{s}-http:2")
    assert wired == ["judge.base_url=http://judge-http:2/v1", "judge.fleet_token=true"]
    assert wiring("reward", ["reward", "rollout"], lambda s: f"{s}:1") == []
    recipe = load_recipe("tiny/rlhf")
    plan = local_overrides(recipe, "hf")
    assert plan["judge"] == [
        "engine=hf",
        "model=smollm2-135m-instruct",
        "engine_config.max_model_len=1024",
    ]
    assert plan["reward"][0].startswith("judge.base_url=http://")
    assert "judge.fleet_token=true" in plan["reward"]  # the fleet's judge checks its token
    assert wiring_problem(recipe, plan) is None
    for service, overrides in plan.items():  # each loads with the service's own config
        assert service_problem(service, overrides, installed_only=True) is None, service
    shown = launch_plan(recipe, LocalProfile(), Path("runs/rlhf"), "hf")
    assert re.search(r"-m rlfleet_rollout .* model=smollm2-135m-instruct .*# judge", shown)


def test_an_external_judge_is_passed_through_and_nothing_is_started() -> None:
    recipe = load_recipe(
        "tiny/rlhf",
        ["judge.base_url=https://judge.example/v1", "judge.model=big-genrm", "judge.engine=null"],
    )
    assert not recipe.judge.served and local_services(recipe) == ["reward", "rollout"]
    plan = local_overrides(recipe, "hf")
    assert "judge" not in plan
    assert "judge.base_url=https://judge.example/v1" in plan["reward"]
    assert "judge.model=big-genrm" in plan["reward"]
    assert not any(o.startswith("judge.fleet_token") for o in plan["reward"])  # kept inside
    assert wiring_problem(recipe, plan) is None


def test_a_genrm_stage_without_a_judge_is_refused_before_it_starts(tmp_path: Path) -> None:
    recipe = load_recipe("tiny/rlhf", ["judge.model=null"])
    problem = wiring_problem(recipe, local_overrides(recipe, "hf"))
    assert problem is not None and "no judge.base_url" in problem and "judge.model" in problem
    # SLURM starts no judge: a served judge must be given as judge.base_url there.
    profile = SlurmProfile(account="a", partition="p")
    slurm = load_recipe("super3/rlhf")
    problem = wiring_problem(slurm, planned_overrides(slurm, profile, tmp_path, "vllm"))
    assert problem is not None and "no judge.base_url" in problem
    one = load_recipe("tiny/rlhf", ["grpo.val_samples_per_prompt=1"])
    problem = wiring_problem(one, local_overrides(one, "hf"))
    assert problem is not None and problem.startswith("grpo.val_samples_per_prompt (1)")
    external = load_recipe("super3/rlhf", ["judge.base_url=http://genrm:8000/v1"])
    assert wiring_problem(external, planned_overrides(external, profile, tmp_path, "vllm")) is None
    # safety asks the judge for each response alone: a judge is needed, groups of one are fine
    safety = ["judge.model=null", "data.default_env=safety", "grpo.val_samples_per_prompt=1"]
    alone = load_recipe("tiny/rlhf", safety)
    problem = wiring_problem(alone, local_overrides(alone, "hf"))
    assert problem is not None and "scores with safety" in problem
    judged = load_recipe("tiny/rlhf", [*safety[1:], "judge.base_url=http://j:1/v1"])
    assert wiring_problem(judged, local_overrides(judged, "hf")) is None


def _metric(url: str, pattern: str) -> float:
    from rlfleet_core.auth import auth_headers

    request = urllib.request.Request(url, headers=auth_headers())  # the fleet's token
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{pattern} (\S+)$", text, re.M))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fleet_starts_the_judge_and_the_gateway_asks_it(tmp_path: Path) -> None:
    """`judge` is a real second rollout (SmolLM2, hf engine); the gateway the fleet
    starts beside it scores a genrm_compare group of 2: one pair judged both ways = 2
    chat completions, counted by the judge's own /metrics (8 tokens are too few for a
    verdict, so the results are JUDGE_ERROR: the wiring, not the judging, is tested)."""
    from rlfleet_core.client import connect_sync
    from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

    overrides = {
        "judge": ["engine=hf", "model=smollm2-135m-instruct", "engine_config.max_model_len=512"],
        "reward": ["environments=[genrm_compare]", "pool.workers=1", "judge.max_tokens=8"],
    }
    with LocalFleet(["reward", "judge"], tmp_path, overrides=overrides) as fleet:
        judge = fleet.processes["judge"]
        row = {"responses_create_params": {"input": [{"role": "user", "content": "Hi?"}]}}
        with connect_sync(fleet.target("reward")) as channel:  # sends the fleet's token
            reply = reward_pb2_grpc.RewardServiceStub(channel).ScoreGroup(
                reward_pb2.ScoreGroupRequest(
                    request_id="g",
                    env="genrm_compare",
                    row_json=json.dumps(row),
                    responses=[reward_pb2.Response(text=t) for t in ("Hello.", "Hi!")],
                ),
                timeout=120,
            )
        served = _metric(
            f"http://127.0.0.1:{judge.http_port}/metrics",
            r'rlfleet_rollout_samples_total\{face="http",finish_reason="[a-z_]+"\}',
        )
    assert served == 2
    assert all(r.failure_kind == reward_pb2.FAILURE_KIND_JUDGE_ERROR for r in reply.results)
    assert [r.info["judge_calls"] for r in reply.results] == ["2", "2"]
    started = json.loads((tmp_path / "startup.json").read_text())["services"]
    assert started["reward"]["after"] == ["judge"]  # the gateway waited for the judge's port
    assert (tmp_path / "logs" / "judge.log").is_file()
