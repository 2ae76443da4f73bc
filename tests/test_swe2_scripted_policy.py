"""SWE2's whole path with a scripted policy: the real rollout service replays a policy
(`engine=scripted`) whose tool calls the trainer's agent loop parses and sends to the real
reward gateway's `swe_agent` episodes, which run them in a real swe-runner session (docker)
and score the submitted patch with Evaluate. A policy that applies the gold fix and
submits scores 1; one that looks around and submits nothing scores 0."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import require_docker, start_service, stop_service, swe_instance_images
from test_multiturn_scripted import call, scripted_rollout_service

pytest.importorskip("rlfleet_swe", reason="the swe-runner package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward service package is not installed")

from rlfleet_contracts.reward_client import RewardClient
from rlfleet_core.calls import CallRetry
from rlfleet_dataprep.swe import BUNDLED, swe_row
from rlfleet_trainer.agent.episodes import EpisodeClient
from rlfleet_trainer.agent.rollout import AgentLimits, AgentRollout
from rlfleet_trainer.agent.tool_format import HermesFormat
from rlfleet_trainer.clients import RolloutClient, Sampling
from rlfleet_trainer.data import Prompt

INSTANCE = json.loads(BUNDLED.read_text().splitlines()[0])
GOLD = [
    call("bash", command=f"git apply <<'RLFLEET_EOF'\n{INSTANCE['patch']}RLFLEET_EOF\n"),
    call("bash", command="git diff --stat"),
    call("submit"),
    "Fixed.",
]
LOOK = [call("bash", command="ls"), call("view", path="."), call("submit"), "Done."]


@pytest.fixture(scope="module")
def reward_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_docker()
    swe_instance_images()
    tmp = tmp_path_factory.mktemp("swe2-scripted")
    label = f"swe2-scripted-{secrets.token_hex(4)}"
    runner, runner_target = start_service(
        "rlfleet_swe",
        [f"eval.runner_label={label}", "eval.memory_bytes=268435456", "eval.pids_limit=64"],
        tmp / "swe.log",
    )
    try:
        reward, target = start_service(
            "rlfleet_reward",
            [
                "environments=[math]",
                "pool.workers=1",
                f"swe.target={runner_target}",
                "swe.memory_bytes=268435456",
                "episodes.tool_timeout_s=60",
                "episodes.close_timeout_s=200",
            ],
            tmp / "reward.log",
        )
        try:
            yield target
        finally:
            stop_service(reward)
    finally:
        stop_service(runner)
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=rlfleet.swe.runner={label}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert left.stdout.split() == [], "containers left behind"


@pytest.mark.parametrize(("script", "reward"), [(GOLD, 1.0), (LOOK, 0.0)], ids=["gold", "look"])
async def test_a_scripted_policy_is_scored_by_its_patch(
    reward_target: str, tmp_path: Path, script: list[str], reward: float
) -> None:
    from rlfleet_core.models import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    row = swe_row(INSTANCE)
    prompt = Prompt(
        prompt_id="s@0", index=0, env="swe_agent", row_json=json.dumps(row), token_ids=(1,)
    )
    with scripted_rollout_service(tmp_path, script) as rollout_target:
        rollout = RolloutClient(rollout_target, 60.0, CallRetry(attempts=1))
        rewards = RewardClient(reward_target, 200.0, CallRetry(attempts=1))
        try:
            agent = AgentRollout(
                rollout,
                EpisodeClient(rewards, 200.0),
                tokenizer,
                HermesFormat(),
                AgentLimits(max_turns=6, max_tokens=4096, max_time_s=300.0),
                envs={"swe_agent"},
            )
            sampling = Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=1500)
            group = await agent.group(prompt, 1, sampling)
        finally:
            await rollout.close()
            await rewards.close()
    (traj,) = group
    assert traj.reward == reward and not traj.truncated
    # bash, bash/view, submit: the episode ended at submit (its result is not appended)
    assert len(traj.turn_weight_versions) == 3
    environment = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if not m]
    text = tokenizer.decode(environment, skip_special_tokens=False)
    assert text.count("<|im_start|>tool\n") == 2 and "exit code: 0" in text
