"""reasoning_gym gives NeMo-Gym's reward on every generated request (services/reward/parity)."""

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

ENV = "reasoning_gym"


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
