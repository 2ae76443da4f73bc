"""Every environment's table of cases through the real gRPC server (Score)."""

from __future__ import annotations

import grpc
import pytest
from cases import ALL_CASES, Case
from reward_support import check_case_over_grpc, score_request
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

PARAMS = [
    pytest.param(env, case, id=f"{env}-{case.id}")
    for env, cases in ALL_CASES.items()
    for case in cases
]


def test_every_environment_has_at_least_20_cases() -> None:
    for env, cases in ALL_CASES.items():
        assert len(cases) >= 20, env
        assert any(c.invalid_field for c in cases), f"{env} has no malformed case"
        assert any(c.reward == 1.0 for c in cases) or env == "low_effort", (
            f"{env} has no correct case"
        )
        assert any(c.reward == 0.0 for c in cases), f"{env} has no wrong case"


@pytest.mark.parametrize(("env", "case"), PARAMS)
def test_case_over_grpc(stub: reward_pb2_grpc.RewardServiceStub, env: str, case: Case) -> None:
    check_case_over_grpc(stub, env, case)


def test_list_environments(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    reply = stub.ListEnvironments(reward_pb2.ListEnvironmentsRequest(), timeout=10)
    by_name = {e.name: e for e in reply.environments}
    assert set(ALL_CASES) <= set(by_name)
    assert list(by_name["math"].required_fields) == ["expected_answer"]
    assert "kwargs" in by_name["instruction_following"].optional_fields
    assert all(e.description for e in reply.environments)
    assert not any(by_name[env].multi_turn for env in ALL_CASES)  # Score's, listed last


def test_list_environments_names_the_multi_turn_ones(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    """The episode environments (OpenEpisode) are listed too, marked multi-turn; the
    single-turn `tool_use` of Score stays listed beside the multi-turn one."""
    reply = stub.ListEnvironments(reward_pb2.ListEnvironmentsRequest(), timeout=10)
    multi = {e.name: e for e in reply.environments if e.multi_turn}
    assert set(multi) == {"tool_use", "math_python", "terminal", "swe_agent"}
    assert list(multi["tool_use"].required_fields) == ["initial_state", "goal_state"]
    assert "expected_answer" in multi["tool_use"].optional_fields
    assert all(e.description and not e.group_aware for e in multi.values())
    single = [e for e in reply.environments if e.name == "tool_use" and not e.multi_turn]
    assert len(single) == 1 and single[0].description != multi["tool_use"].description


@pytest.mark.parametrize(("env", "field"), [("", "env"), ("nope", "env")])
def test_bad_env_is_invalid_argument(
    stub: reward_pb2_grpc.RewardServiceStub, env: str, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Score(score_request(env, {"expected_answer": "1"}, "1"), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}:")
    assert "math" in err.value.details()  # names the valid choices
