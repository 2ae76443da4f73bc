"""Multi-turn through all the real services, each its own process on loopback: the rollout
service replays a policy (`engine=scripted`, test-only) that makes three `python` tool
calls and answers; the trainer's agent loop drives it against the reward gateway's
`math_python` environment, whose tool runs in the real sandbox. The mask covers exactly the
model's tokens, the tool results are the sandbox's output, and the reward is the grader's."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from support import sandbox_and_reward
from test_multiturn_scripted import call, scripted_rollout_service

pytest.importorskip("rlfleet_sandbox", reason="the sandbox service package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward service package is not installed")

from rlfleet_contracts.reward_client import RewardClient
from rlfleet_core.calls import CallRetry
from rlfleet_trainer.agent.episodes import EpisodeClient
from rlfleet_trainer.agent.rollout import AgentLimits, AgentRollout
from rlfleet_trainer.agent.tool_format import HermesFormat
from rlfleet_trainer.batch import build_train_batch
from rlfleet_trainer.clients import RolloutClient, Sampling
from rlfleet_trainer.data import Prompt

SCRIPT = [
    call("python", code="x = 12 * 12"),
    call("python", code="y = x + 1"),
    call("python", code="print(y)"),
    "The answer is \\boxed{145}.",
]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(rollout, reward) targets; the reward gateway runs its python tool in the sandbox."""
    tmp = tmp_path_factory.mktemp("multiturn-services")
    reward_args = ["environments=[math]", "pool.workers=1"]
    with (
        sandbox_and_reward(tmp, reward_args) as (_, _, reward_target),
        scripted_rollout_service(tmp, SCRIPT) as rollout_target,
    ):
        yield rollout_target, reward_target


def math_prompt(expected: str) -> Prompt:
    row = {
        "id": "m",
        "env": "math_python",
        "expected_answer": expected,
        "responses_create_params": {"input": [{"role": "user", "content": "What is 12^2 + 1?"}]},
    }
    return Prompt(
        prompt_id="m@0", index=0, env="math_python", row_json=json.dumps(row), token_ids=(1,)
    )


@pytest.mark.parametrize(("expected", "reward"), [("145", 1.0), ("144", 0.0)])
async def test_three_python_calls_through_rollout_reward_and_sandbox(
    targets: tuple[str, str], expected: str, reward: float
) -> None:
    from rlfleet_core.models import resolve_model
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny"))
    rollout = RolloutClient(targets[0], 30.0, CallRetry(attempts=1))
    rewards = RewardClient(targets[1], 30.0, CallRetry(attempts=1))
    try:
        agent = AgentRollout(
            rollout,
            EpisodeClient(rewards, 30.0),
            tokenizer,
            HermesFormat(),
            AgentLimits(max_turns=8, max_tokens=4096, max_time_s=120.0),
            envs={"math_python"},
        )
        sampling = Sampling(temperature=1.0, top_p=1.0, top_k=0, max_tokens=200)
        group = await agent.group(math_prompt(expected), 2, sampling)
    finally:
        await rollout.close()
        await rewards.close()
    assert [(t.truncated, t.reward) for t in group] == [(False, reward)] * 2
    eos = tokenizer.eos_token_id
    expected_ids = [t for turn in SCRIPT for t in [*tokenizer.encode(turn), eos]]
    for traj in group:
        assert traj.loss_mask is not None and len(traj.turn_weight_versions) == len(SCRIPT)
        model = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        assert model == expected_ids  # the mask covers exactly the model's tokens
        environment = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if not m]
        text = tokenizer.decode(environment, skip_special_tokens=False)
        # three tool answers, the last one the sandbox's output of print(y)
        assert text.count("<|im_start|>tool\n") == 3 and "145" in text
        batch = build_train_batch([traj], torch.ones(1))
        on = batch.mask_NT[0] > 0
        assert batch.input_ids_NL[0, 1:][on].tolist() == expected_ids
