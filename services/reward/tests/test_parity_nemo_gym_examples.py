"""NeMo-Gym's own example rows for mcqa, instruction_following and reasoning_gym load
unchanged and score as NeMo-Gym scores them (needs the side environment)."""

from __future__ import annotations

import pytest
from parity_support import LIVE_SKIP_REASON, differences, example_cases, live_available
from reward_support import RewardServer


@pytest.mark.skipif(not live_available(), reason=LIVE_SKIP_REASON)
@pytest.mark.parametrize("env", ["mcqa", "instruction_following", "reasoning_gym"])
def test_nemo_gym_example_rows(reward_server: RewardServer, env: str) -> None:
    cases = example_cases(env)
    assert cases and all(c["reward"] is not None for c in cases)
    diffs = differences(reward_server.http_url, env, cases)
    assert not diffs, f"{len(diffs)} differences:\n" + "\n".join(diffs)
