"""The low-effort reward pinned on hand-worked numbers: reward = c − λ·c·min(1, n/B), with c
the wrapped environment's reward, n the generated tokens, B the budget and λ the weight.

The Nemotron 3 Super recipe says only that a low-effort prompt's reward "accounts for both
correctness and token count"; the exact shape is ours (docs/reward.md, low_effort.py)."""

from __future__ import annotations

import json

import pytest
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.environments.low_effort import length_discount


@pytest.mark.parametrize(
    ("c", "n", "budget", "weight", "reward"),
    [
        (1.0, 0, 2048, 0.5, 1.0),  # no tokens: no discount
        (1.0, 512, 2048, 0.5, 0.875),  # 1 − 0.5·512/2048
        (1.0, 2048, 2048, 0.5, 0.5),  # at the budget: the full discount λ
        (1.0, 4096, 2048, 0.5, 0.5),  # past it: no further discount
        (0.0, 100, 2048, 0.5, 0.0),  # wrong stays 0, whatever the length
        (0.5, 1024, 2048, 0.5, 0.375),  # partial credit is discounted in proportion
        (1.0, 64, 64, 1.0, 0.0),  # λ = 1: a correct answer at the budget earns nothing
        (1.0, 64, 64, 0.0, 1.0),  # λ = 0: length does not count
    ],
)
def test_low_effort_reward_by_hand(
    c: float, n: int, budget: float, weight: float, reward: float
) -> None:
    assert c + length_discount(c, n, budget, weight) == pytest.approx(reward, abs=1e-12)


def test_gateway_discounts_a_correct_answer_by_its_token_count(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    """Same correct answer, different token counts, through ScoreGroup: 1 − 0.5·n/256."""
    row = json.dumps({"inner_env": "math", "expected_answer": "4", "token_budget": 256})
    counts = [1, 64, 128, 256, 1000]
    request = reward_pb2.ScoreGroupRequest(
        env="low_effort",
        row_json=row,
        responses=[reward_pb2.Response(text=r"\boxed{4}", num_tokens=n) for n in counts],
    )
    results = stub.ScoreGroup(request, timeout=30).results
    rewards = [r.reward for r in results]
    assert rewards == pytest.approx([1 - 0.5 / 256, 0.875, 0.75, 0.5, 0.5], abs=1e-9)
    assert [r.reward_components["length_penalty"] for r in results] == pytest.approx(
        [-0.5 / 256, -0.125, -0.25, -0.5, -0.5], abs=1e-9
    )
    wrong = stub.ScoreGroup(
        reward_pb2.ScoreGroupRequest(
            env="low_effort",
            row_json=row,
            responses=[reward_pb2.Response(text=r"\boxed{5}", num_tokens=10)],
        ),
        timeout=30,
    ).results
    assert wrong[0].reward == 0.0
