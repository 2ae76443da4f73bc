"""The ScoreGroup reply check of the reward client (no server needed)."""

from __future__ import annotations


def test_score_group_problem_names_the_first_failure_or_a_count_mismatch() -> None:
    from rlfleet_contracts.reward_client import score_group_problem
    from rlfleet_proto.v1 import reward_pb2

    ok = reward_pb2.ScoreResult(reward=1.0)
    bad = reward_pb2.ScoreResult(
        failure_kind=reward_pb2.FAILURE_KIND_TIMEOUT, failure_reason="verifier took 30 s"
    )
    assert score_group_problem(reward_pb2.ScoreGroupResult(results=[ok, ok]), 2) is None
    reply = reward_pb2.ScoreGroupResult(results=[ok, bad])
    assert score_group_problem(reply, 2) == "FAILURE_KIND_TIMEOUT: verifier took 30 s"
    assert score_group_problem(reward_pb2.ScoreGroupResult(results=[ok]), 2) == (
        "1 results for 2 responses"
    )
