"""mcqa gives NeMo-Gym's reward on every generated request (services/reward/parity)."""

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

ENV = "mcqa"


def test_recorded_cases_are_the_generators() -> None:
    recorded = load_recorded(ENV)
    generated = record_mir.generate(ENV)
    assert len(recorded) >= 500
    assert [c["request"] for c in recorded] == [c["request"] for c in generated]


def test_parity_with_recorded_nemo_gym_rewards(reward_server: RewardServer) -> None:
    diffs = differences(reward_server.http_url, ENV, load_recorded(ENV))
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs)


@pytest.mark.skipif(not live_available(), reason=LIVE_SKIP_REASON)
def test_parity_with_live_nemo_gym(reward_server: RewardServer) -> None:
    cases = record_mir.generate(ENV)
    for case, result in zip(cases, record_mir.reference_results(cases), strict=True):
        assert result["reward"] is not None, f"{case['category']}: {result['error']}"
        case["reward"], case["extracted"] = result["reward"], result.get("extracted")
    diffs = differences(reward_server.http_url, ENV, cases)
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs)


def test_default_mode_reads_the_text_nemo_gym_reads() -> None:
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
