"""The multi-turn `tool_use` environment (a small bank) through the real gRPC server:
a table of scripted episodes, the row checks of OpenEpisode, and the hostile inputs of
the episode API (ownership, closed episodes, huge arguments, caps)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from episode_support import Caller
from reward_support import RewardServer, module_stub, reward_stub, running_reward_server
from rlfleet_proto.v1 import reward_pb2_grpc
from rlfleet_reward.row_check import check_row

WORLD = {
    "accounts": {
        "A1": {"owner": "alice", "balance": 100},
        "A2": {"owner": "bob", "balance": 50},
        "A3": {"owner": "alice", "balance": 20, "frozen": True},
    }
}


def row(**goal_balances: Any) -> dict[str, Any]:
    """A row whose goal is WORLD with some fields changed: A1=70 or A3_frozen=False."""
    goal = copy.deepcopy(WORLD)
    for key, value in goal_balances.items():
        account, _, attr = key.partition("_")
        goal["accounts"][account][attr or "balance"] = value
    return {"initial_state": WORLD, "goal_state": goal}


def transfer(source: str, target: str, amount: Any) -> tuple[str, dict[str, Any]]:
    """The `transfer` call of `amount` from account `source` to `target`."""
    return "transfer", {"from_account": source, "to_account": target, "amount": amount}


T = transfer("A1", "A2", 30)
SOLVED = row(A1=70, A2=80)

# (id, row, calls, final text, reward, error flags of the calls)
CASES: list[tuple[str, dict[str, Any], list[tuple[str, Any]], str, float, list[bool]]] = [
    (
        "solved",
        SOLVED,
        [("list_accounts", {"owner": "Alice"}), ("get_balance", {"account_id": "A1"}), T],
        "done",
        1.0,
        [False] * 3,
    ),
    ("wrong_amount", SOLVED, [transfer("A1", "A2", 40)], "", 0.0, [False]),
    ("no_calls", SOLVED, [], "I did it", 0.0, []),
    (
        "detour",
        SOLVED,
        [T, transfer("A2", "A1", 10), transfer("A1", "A2", 10)],
        "",
        1.0,
        [False] * 3,
    ),
    ("frozen", row(A3=0, A2=70), [transfer("A3", "A2", 20)], "", 0.0, [True]),
    (
        "unfreeze_first",
        row(A3=0, A2=70, A3_frozen=False),
        [
            ("set_frozen", {"account_id": "A3", "frozen": False}),
            transfer("A3", "A2", 20),
            ("get_balance", {"account_id": "A3"}),
        ],
        "",
        1.0,
        [False] * 3,
    ),
    ("insufficient", row(A2=0, A1=150), [transfer("A2", "A1", 60)], "", 0.0, [True]),
    ("unknown_tool", SOLVED, [("wire_money", {}), T], "", 1.0, [True, False]),
    ("bad_json", SOLVED, [("transfer", '{"from_account": "A1",'), T], "", 1.0, [True, False]),
    ("not_object", SOLVED, [("transfer", "[1, 2]"), T], "", 1.0, [True, False]),
    ("wrong_type", SOLVED, [transfer("A1", "A2", "30"), T], "", 1.0, [True, False]),
    (
        "extra_arg",
        SOLVED,
        [("get_balance", {"account_id": "A1", "pin": 1234}), T],
        "",
        1.0,
        [True, False],
    ),
    (
        "missing_arg",
        SOLVED,
        [("transfer", {"from_account": "A1", "amount": 30}), T],
        "",
        1.0,
        [True, False],
    ),
    ("negative", SOLVED, [transfer("A1", "A2", -30), T], "", 1.0, [True, False]),
    ("unknown_account", SOLVED, [("get_balance", {"account_id": "Z9"}), T], "", 1.0, [True, False]),
    ("same_account", SOLVED, [transfer("A1", "A1", 30), T], "", 1.0, [True, False]),
    ("three_decimals", SOLVED, [transfer("A1", "A2", 0.001), T], "", 1.0, [True, False]),
    (
        "decimals_exact",
        row(A1=99.7, A2=50.3),
        [transfer("A1", "A2", 0.1), transfer("A1", "A2", 0.2)],
        "",
        1.0,
        [False, False],
    ),
    (
        "answer_right",
        {**row(), "expected_answer": "150"},
        [
            ("get_balance", {"account_id": "A1"}),
            ("get_balance", {"account_id": "A2"}),
            ("list_accounts", {}),
        ],
        "Together they hold 150.",
        1.0,
        [False] * 3,
    ),
    (
        "answer_wrong",
        {**row(), "expected_answer": "150"},
        [("get_balance", {"account_id": "A1"})],
        "Together they hold 1500.",
        0.0,
        [False],
    ),
    ("answer_right_state_wrong", {**row(), "expected_answer": "150"}, [T], "150", 0.0, [False]),
    ("empty_arguments", row(), [("list_accounts", "")], "", 1.0, [False]),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RewardServer]:
    with running_reward_server(
        tmp_path_factory.mktemp("episodes"),
        [
            "environments=[math]",
            "pool.workers=1",
            "episodes.max_open=6",
            "episodes.max_output_chars=300",
            "episodes.max_arguments_chars=1000",
            "episodes.max_calls_per_step=8",
        ],
        name="episodes",
    ) as running:
        yield running


stub = module_stub()


@pytest.mark.parametrize(
    ("case_id", "data", "calls", "text", "reward", "errors"), CASES, ids=[c[0] for c in CASES]
)
def test_scripted_episode(
    stub: reward_pb2_grpc.RewardServiceStub,
    case_id: str,
    data: dict[str, Any],
    calls: list[tuple[str, Any]],
    text: str,
    reward: float,
    errors: list[bool],
) -> None:
    caller = Caller(stub)
    episode = caller.open("tool_use", data)
    assert [t.name for t in episode.tools] == [
        "list_accounts",
        "get_balance",
        "transfer",
        "set_frozen",
    ]
    assert json.loads(episode.tools[2].parameters_json)["required"] == [
        "from_account",
        "to_account",
        "amount",
    ]
    got = []
    for call in calls:  # one call per Step, as a policy turn would
        result = caller.step(episode.episode_id, call).results[0]
        assert result.name == call[0] and result.call_id == "c0" and result.content
        got.append(result.error)
    assert got == errors
    score = caller.close(episode.episode_id, text)
    assert score.failure_kind == 0, score.failure_reason
    assert score.reward == reward, dict(score.info)
    assert dict(score.reward_components) == {"task": reward}


def test_error_results_say_why(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    episode = caller.open("tool_use", SOLVED)
    results = caller.step(
        episode.episode_id,
        ("wire_money", {}),
        ("transfer", '{"from_account": '),
        transfer("A1", "A2", "30"),
        transfer("A3", "A2", 1),
        ("get_balance", {"account_id": "A1"}),
    ).results
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3", "c4"]
    assert "unknown tool 'wire_money'" in results[0].content and "transfer" in results[0].content
    assert results[1].content.startswith("arguments are not valid JSON")
    assert "amount" in results[2].content and "is not of type 'number'" in results[2].content
    assert results[3].content == "account 'A3' is frozen"
    assert json.loads(results[4].content) == {"account_id": "A1", "balance": 100}
    caller.close(episode.episode_id, abandon=True)


def test_close_counts_the_calls_by_kind(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    """The score's info counts the episode's calls by how they ended (the trainer's
    hallucination rate reads them): unknown tool, arguments refused before the tool ran
    (not JSON, not an object, outside the schema), the tool's own refusal, and calls that ran."""
    caller = Caller(stub)
    episode = caller.open("tool_use", SOLVED)
    caller.step(
        episode.episode_id,
        ("wire_money", {}),
        ("transfer", '{"from_account": '),
        ("transfer", "[1, 2]"),
        transfer("A1", "A2", "30"),
        transfer("A3", "A2", 1),
        ("get_balance", {"account_id": "Z9"}),
    )
    caller.step(episode.episode_id, T)
    score = caller.close(episode.episode_id, "done")
    assert score.reward == 1.0
    assert {k: v for k, v in score.info.items() if k.startswith("calls/")} == {
        "calls/ok": "1",
        "calls/unknown_tool": "1",
        "calls/invalid_arguments": "3",
        "calls/tool_error": "2",
        "calls/after_end": "0",
    }


def test_row_tools_are_shown_and_limit_the_calls(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    tools = [
        {
            "type": "function",
            "name": "transfer",
            "description": "Send money.",
            "parameters": {"type": "object"},
        },
        {"type": "function", "function": {"name": "get_balance", "description": "Balance."}},
    ]
    caller = Caller(stub)
    episode = caller.open(
        "tool_use", {**SOLVED, "responses_create_params": {"input": "hi", "tools": tools}}
    )
    assert [(t.name, t.description) for t in episode.tools] == [
        ("transfer", "Send money."),
        ("get_balance", "Balance."),
    ]
    assert json.loads(episode.tools[0].parameters_json) == {"type": "object"}
    result = caller.step(episode.episode_id, ("list_accounts", {}), T).results
    assert result[0].error and "the tools are: transfer, get_balance" in result[0].content
    assert not result[1].error  # checked against the environment's own schema
    assert caller.close(episode.episode_id, "ok").reward == 1.0


@pytest.mark.parametrize(
    ("env", "data", "field"),
    [
        ("tool_use", {"goal_state": WORLD}, "row.initial_state"),
        ("tool_use", {"initial_state": WORLD}, "row.goal_state"),
        (
            "tool_use",
            {"initial_state": {"accounts": {}}, "goal_state": WORLD},
            "row.initial_state.accounts",
        ),
        (
            "tool_use",
            {**SOLVED, "goal_state": {"accounts": {"A1": {"owner": "a", "balance": 1}}}},
            "row.goal_state.accounts",
        ),
        ("tool_use", row(A1=-5), "row.goal_state.accounts.A1.balance"),
        ("tool_use", row(A1=0.001), "row.goal_state.accounts.A1.balance"),
        ("tool_use", row(A1="100"), "row.goal_state.accounts.A1.balance"),
        ("tool_use", row(A2_owner=""), "row.goal_state.accounts.A2.owner"),
        ("tool_use", row(A2_frozen="yes"), "row.goal_state.accounts.A2.frozen"),
        ("tool_use", {**SOLVED, "expected_answer": ["a"]}, "row.expected_answer"),
        (
            "tool_use",
            {**SOLVED, "responses_create_params": {"tools": [{"name": "rm"}]}},
            "row.responses_create_params.tools[0].name",
        ),
        (
            "tool_use",
            {**SOLVED, "responses_create_params": {"tools": "all"}},
            "row.responses_create_params.tools",
        ),
        ("tool_use", "[1]", "row_json"),
        ("tool_use", "{not json", "row_json"),
        ("nope", SOLVED, "env"),
        ("", SOLVED, "env"),
    ],
)
def test_open_refuses_bad_rows(
    stub: reward_pb2_grpc.RewardServiceStub, env: str, data: Any, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        Caller(stub).open(env, data)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field + ":"), err.value.details()
    if field == "env":
        assert "known: tool_use, math_python, terminal" in err.value.details()


def test_other_callers_and_closed_episodes_are_not_found(
    stub: reward_pb2_grpc.RewardServiceStub,
) -> None:
    alice, mallory = Caller(stub), Caller(stub)
    episode = alice.open("tool_use", SOLVED)
    for attempt in (
        lambda: mallory.step(episode.episode_id, T),
        lambda: mallory.close(episode.episode_id, "done"),
        lambda: mallory.close(episode.episode_id, abandon=True),
        lambda: Caller(stub, key="").step(episode.episode_id, T),
    ):
        with pytest.raises(grpc.RpcError) as err:
            attempt()
        assert err.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
        if err.value.code() is grpc.StatusCode.INVALID_ARGUMENT:  # no key at all
            assert err.value.details().startswith("x-rlfleet-client-key:")
    # The attempts changed nothing: the owner's episode goes on and scores.
    assert not alice.step(episode.episode_id, T).results[0].error
    assert alice.close(episode.episode_id, "done").reward == 1.0
    for attempt in (
        lambda: alice.step(episode.episode_id, T),
        lambda: alice.close(episode.episode_id),
    ):
        with pytest.raises(grpc.RpcError) as err:
            attempt()
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        assert "is closed (scored)" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        alice.step("ep-made-up", T)
    assert err.value.code() is grpc.StatusCode.NOT_FOUND


def test_abandon_frees_without_scoring(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    episode = caller.open("tool_use", SOLVED)
    caller.step(episode.episode_id, T)
    result = caller.close(episode.episode_id, abandon=True)
    assert result.mask_sample and result.info["abandoned"] == "true" and result.env == "tool_use"
    with pytest.raises(grpc.RpcError) as err:
        caller.close(episode.episode_id, "done")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND and "abandoned" in err.value.details()


def test_huge_inputs(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    episode = caller.open("tool_use", SOLVED)
    huge = {"account_id": "A1" * 5000}
    deep = "[" * 5000 + "]" * 5000
    results = caller.step(
        episode.episode_id, ("get_balance", huge), ("get_balance", deep), T
    ).results
    assert results[0].error and "too long" in results[0].content
    assert results[1].error and "too long" in results[1].content
    assert not results[2].error
    with pytest.raises(grpc.RpcError) as err:  # more calls than episodes.max_calls_per_step
        caller.step(episode.episode_id, *[("list_accounts", {})] * 9)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("calls:")
    with pytest.raises(grpc.RpcError) as err:  # over limits.max_request_bytes
        caller.step(episode.episode_id, ("get_balance", "x" * (9 << 20)))
    assert err.value.code() in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    # Output is capped: listing 1000 accounts would be ~50 kB.
    many = {"accounts": {f"A{i}": {"owner": "o", "balance": 1} for i in range(1000)}}
    big = caller.open("tool_use", {"initial_state": many, "goal_state": many})
    listed = caller.step(big.episode_id, ("list_accounts", {})).results[0]
    assert len(listed.content) <= 300 and "[output truncated:" in listed.content
    assert caller.close(big.episode_id).reward == 1.0
    assert caller.close(episode.episode_id).reward == 1.0


def test_open_episodes_are_capped(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    opened = []
    with pytest.raises(grpc.RpcError) as err:
        for _ in range(7):  # episodes.max_open=6
            opened.append(caller.open("tool_use", SOLVED).episode_id)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "episodes.max_open" in err.value.details()
    for episode_id in opened:
        caller.close(episode_id, abandon=True)
    caller.close(caller.open("tool_use", SOLVED).episode_id, abandon=True)  # room again


def test_idle_episodes_are_closed(tmp_path: Path) -> None:
    with (
        running_reward_server(
            tmp_path,
            ["environments=[math]", "pool.workers=1", "episodes.idle_timeout_s=1"],
            name="idle",
        ) as server,
        reward_stub(server) as stub,
    ):
        caller = Caller(stub)
        episode = caller.open("tool_use", SOLVED)
        assert episode.idle_timeout_s == 1.0
        time.sleep(3)  # > idle_timeout_s + the reaper's period (idle_timeout_s / 4)
        with pytest.raises(grpc.RpcError) as err:
            caller.step(episode.episode_id, T)
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        assert "idle for over 1s" in err.value.details()


def test_data_prep_checks_multi_turn_rows() -> None:
    assert check_row({"env": "tool_use", **SOLVED}) == []
    assert check_row({"env": "terminal", "check": "true", "files": {"a": "x"}}) == []
    assert check_row({"env": "math_python", "expected_answer": "2"}) == []
    assert check_row({"env": "terminal", "files": {"a": "x"}}) == ["check: required, but missing"]
    single = {"env": "tool_use", "expected_tool_call": {"name": "f", "arguments": {}}}
    assert check_row(single) == []  # the single-turn tool_use row still passes
    broken = check_row({"env": "tool_use", "initial_state": WORLD})
    assert broken == [
        "expected_tool_call: required, but missing",
        "or, as multi-turn tool_use: goal_state: required: an object with `accounts`",
    ]
