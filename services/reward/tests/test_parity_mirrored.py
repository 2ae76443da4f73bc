"""mcqa, instruction_following and reasoning_gym give NeMo-Gym's reward on every generated
request (services/reward/parity; math and structured outputs: test_parity_nemo_gym.py)."""

from __future__ import annotations

import pytest
from parity_support import (
    LIVE_SKIP_REASON,
    differences,
    live_available,
    load_recorded,
    record_mir,
)
from reward_support import RewardServer

ENVS = ("mcqa", "instruction_following", "reasoning_gym")


@pytest.mark.parametrize("env", ENVS)
def test_recorded_cases_are_the_generators(env: str) -> None:
    recorded = load_recorded(env)
    generated = record_mir.generate(env)
    assert len(recorded) >= 500
    assert [c["request"] for c in recorded] == [c["request"] for c in generated]


@pytest.mark.parametrize("env", ENVS)
def test_parity_with_recorded_nemo_gym_rewards(reward_server: RewardServer, env: str) -> None:
    diffs = differences(reward_server.http_url, env, load_recorded(env))
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs)


@pytest.mark.skipif(not live_available(), reason=LIVE_SKIP_REASON)
@pytest.mark.parametrize("env", ENVS)
def test_parity_with_live_nemo_gym(reward_server: RewardServer, env: str) -> None:
    cases = record_mir.generate(env)
    for case, result in zip(cases, record_mir.reference_results(cases), strict=True):
        assert result["reward"] is not None, f"{case['category']}: {result['error']}"
        case["reward"], case["extracted"] = result["reward"], result.get("extracted")
    diffs = differences(reward_server.http_url, env, cases)
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs)


def test_mcqa_default_mode_reads_the_text_nemo_gym_reads() -> None:
    """NeMo-Gym's mcqa grades `response.output_text`, a `<think>` part included: a box only
    inside it scores 1 there (checked against nemo-gym 0.7.0's server, 2026-11-27), so it
    does here by default; rlfleet's `lenient` mode never grades the `<think>` part."""
    from rlfleet_reward.environments import get_environment
    from rlfleet_reward.types import Sample

    env = get_environment("mcqa")
    raw = "<think>\\boxed{A}</think>I am not sure."
    sample = Sample("I am not sure.", output_text=raw)
    row = {"options": [{"A": "one"}, {"B": "two"}], "expected_answer": "A"}
    assert env.score(env.parse_row(row), sample).reward == 1.0
    lenient = env.parse_row({**row, "grading_mode": "lenient"})
    assert env.score(lenient, sample).reward == 0.0
