"""The GenRM's throughput per step (`genrm/*` metrics): busy time as the union of the
judged ScoreGroup calls' intervals (hand-computed), the comparisons the gateway reports in
`info.judge_calls`, read by the real RewardClient over loopback gRPC, and the rate of
empty steps carried into the next logged one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from grpc import aio
from rlfleet_contracts.judge_tally import JudgeTally, busy_seconds
from rlfleet_contracts.reward_client import RewardClient
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_trainer.loop import carry_failures


def test_busy_seconds_is_the_union_of_intervals() -> None:
    # [0, 4] ∪ [1, 3] ∪ [3.5, 5] = [0, 5]; [7, 8]; [8, 9] touches it: [7, 9] → 5 + 2
    assert busy_seconds([(7, 8), (0, 4), (1, 3), (3.5, 5), (8, 9)]) == pytest.approx(7.0)
    assert busy_seconds([]) == 0.0


def test_tally_gives_the_window_rate_then_resets() -> None:
    tally = JudgeTally()
    assert tally.take() == {}  # no judged group: no genrm metrics
    tally.record(8, 10.0, 14.0)
    tally.record(8, 12.0, 16.0)  # concurrent with the first: busy 6 s, not 8
    tally.record(0, 20.0, 20.5)  # a retried group answered from the gateway's cache
    assert tally.take() == {
        "genrm/comparisons": 16.0,
        "genrm/busy_s": pytest.approx(6.5),
        "genrm/comparisons_per_s": pytest.approx(16 / 6.5),
    }
    assert tally.take() == {}


def test_empty_steps_carry_counts_and_the_rate_is_recomputed() -> None:
    empty = {"genrm/comparisons": 8.0, "genrm/busy_s": 2.0, "genrm/comparisons_per_s": 4.0}
    step = {"genrm/comparisons": 24.0, "genrm/busy_s": 4.0, "genrm/comparisons_per_s": 6.0}
    merged = carry_failures(empty, step)
    assert merged["genrm/comparisons"] == 32.0 and merged["genrm/busy_s"] == 6.0
    assert merged["genrm/comparisons_per_s"] == pytest.approx(32 / 6)


class JudgedReward(reward_pb2_grpc.RewardServiceServicer):
    """Answers like genrm_compare: every result carries the group's `judge_calls`
    (2 per response: a ring judged both ways); `plain` requests carry none."""

    async def ScoreGroup(
        self, request: reward_pb2.ScoreGroupRequest, context: aio.ServicerContext[Any, Any]
    ) -> reward_pb2.ScoreGroupResult:
        await asyncio.sleep(0.05)
        n = len(request.responses)
        info = {} if request.env == "plain" else {"judge_calls": str(2 * n)}
        results = [
            reward_pb2.ScoreResult(request_id=f"{request.request_id}/{i}", reward=i, info=info)
            for i in range(n)
        ]
        return reward_pb2.ScoreGroupResult(request_id=request.request_id, results=results)


@pytest_asyncio.fixture
async def reward_target() -> AsyncIterator[str]:
    server = aio.server()
    reward_pb2_grpc.add_RewardServiceServicer_to_server(JudgedReward(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def test_reward_client_counts_judge_comparisons(reward_target: str) -> None:
    client = RewardClient(reward_target, timeout_s=30)
    try:
        texts = ["a", "b", "c", "d"]
        await asyncio.gather(
            *(client.score_group(f"p{i}", "genrm_compare", "{}", texts, [1] * 4) for i in range(3))
        )
        await client.score_group("q", "plain", "{}", texts, [1] * 4)
        metrics = client.judge.take()
    finally:
        await client.close()
    assert metrics["genrm/comparisons"] == 24.0  # 3 groups × 8
    assert metrics["genrm/busy_s"] > 0
    assert metrics["genrm/comparisons_per_s"] == pytest.approx(24.0 / metrics["genrm/busy_s"])
