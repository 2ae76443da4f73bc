"""Cross-service: the sandbox-backed multi-turn environments (`math_python`, `terminal`)
through the real reward and sandbox services, each as its own process on loopback.

Scripted episodes make >= 3 tool calls over gRPC (OpenEpisode / Step / CloseEpisode) and
the rewards match the goal: the boxed answer for `math_python`, the row's check script
over the final files for `terminal`. Hostile calls (endless output, a work dir that
grows without bound, a command that never ends, path tricks in the row) come back as
error results or INVALID_ARGUMENT, and the episode goes on.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rlfleet_proto.v1 import reward_pb2_grpc
from support import sandbox_and_reward

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services/reward/tests"))
from episode_support import Caller

pytest.importorskip("rlfleet_sandbox", reason="the sandbox service package is not installed")


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[reward_pb2_grpc.RewardServiceStub]:
    tmp = tmp_path_factory.mktemp("episodes-sandbox")
    # The sandbox holds few sessions, to see its cap reach the caller (each episode has a
    # sandbox client key of its own, so the per-client quota does not apply to the gateway).
    reward_args = [
        "environments=[math]",
        "pool.workers=1",
        "episodes.tool_timeout_s=8",
        "episodes.max_output_chars=2000",
        "episodes.max_state_bytes=65536",
    ]
    sandbox_args = ["sessions.max_sessions=3"]
    with (
        sandbox_and_reward(tmp, reward_args, sandbox_args) as (_, _, target),
        grpc.insecure_channel(target) as channel,
    ):
        yield reward_pb2_grpc.RewardServiceStub(channel)


MATH = {"expected_answer": "145", "responses_create_params": {"input": "What is 12^2 + 1?"}}
MATH_CALLS = [
    ("python", {"code": "x = 12 * 12"}),
    ("python", {"code": "y = x + 1"}),
    ("python", {"code": "print(y)"}),
]


@pytest.mark.parametrize(
    ("final", "reward"),
    [("So the answer is \\boxed{145}.", 1.0), ("\\boxed{144}", 0.0), ("no idea", 0.0)],
)
def test_math_python_keeps_state_and_grades_the_answer(
    stub: reward_pb2_grpc.RewardServiceStub, final: str, reward: float
) -> None:
    caller = Caller(stub)
    episode = caller.open("math_python", MATH)
    assert [t.name for t in episode.tools] == ["python"]
    results = [caller.step(episode.episode_id, call).results[0] for call in MATH_CALLS]
    assert [r.error for r in results] == [False, False, False]
    assert results[2].content.strip() == "145"
    score = caller.close(episode.episode_id, final)
    assert score.failure_kind == 0, score.failure_reason
    assert score.reward == reward and dict(score.reward_components) == {"correctness": reward}


def test_math_python_failures_are_results(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    episode = caller.open("math_python", MATH)
    caller.step(episode.episode_id, *MATH_CALLS)
    crash, flood, bad, after = caller.step(
        episode.episode_id,
        ("python", {"code": "z = 1 / 0"}),
        ("python", {"code": "print('a' * 1_000_000)"}),
        ("python", {"code": 12}),
        ("python", {"code": "print('alive')"}),
    ).results
    (endless, kept) = caller.step(
        episode.episode_id,
        ("python", {"code": "while True: pass"}),
        ("python", {"code": "print(y)"}),
    ).results
    assert "timed out" in endless.content and kept.content.strip() == "145"
    assert not crash.error and "ZeroDivisionError" in crash.content
    assert len(flood.content) <= 2000 and "[output truncated:" in flood.content
    assert bad.error and "is not of type 'string'" in bad.content
    assert after.content.strip() == "alive"
    with pytest.raises(grpc.RpcError) as err:
        Caller(stub).step(episode.episode_id, ("python", {"code": "print(x)"}))
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    assert caller.close(episode.episode_id, "\\boxed{145}").reward == 1.0


def test_math_python_row_is_checked(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        Caller(stub).open("math_python", {"question": "?"})
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("row.expected_answer:")


def test_math_python_sessions_are_capped_and_freed(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    opened = [caller.open("math_python", MATH).episode_id for _ in range(3)]
    with pytest.raises(grpc.RpcError) as err:
        caller.open("math_python", MATH)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the sandbox is busy" in err.value.details()
    caller.close(opened.pop(), abandon=True)  # frees its sandbox session
    opened.append(caller.open("math_python", MATH).episode_id)
    for episode_id in opened:
        caller.close(episode_id, abandon=True)


SORT = {
    "files": {"data.txt": "pear\napple\nfig\n", "notes/readme.md": "sort data.txt into sorted.txt"},
    "check": 'test "$(cat sorted.txt)" = "$(printf "apple\\nfig\\npear")"',
}
TERMINAL_CASES: list[tuple[str, dict[str, Any], list[str], float]] = [
    ("solved", SORT, ["ls -R", "cat data.txt", "sort data.txt > sorted.txt"], 1.0),
    ("wrong", SORT, ["ls", "cat data.txt", "sort -r data.txt > sorted.txt"], 0.0),
    ("no_commands", SORT, [], 0.0),
    (
        "steps_build_on_each_other",
        SORT,
        ["cp data.txt tmp.txt", "sort tmp.txt > sorted.txt", "rm tmp.txt"],
        1.0,
    ),
    (
        "deleted_file",
        {"files": {"junk.log": "x"}, "check": "test ! -e junk.log && test -s keep.txt"},
        ["cat junk.log > keep.txt", "rm junk.log", "ls"],
        1.0,
    ),
    ("cd_does_not_persist", {"check": "test -f d/f"}, ["mkdir d", "cd d", "touch f"], 0.0),
    (
        "executable",
        {"check": "./run.sh | grep -qx ok"},
        ["printf '#!/bin/bash\\necho ok\\n' > run.sh", "chmod +x run.sh", "./run.sh"],
        1.0,
    ),
]


@pytest.mark.parametrize(
    ("case_id", "row", "commands", "reward"), TERMINAL_CASES, ids=[c[0] for c in TERMINAL_CASES]
)
def test_terminal_episode(
    stub: reward_pb2_grpc.RewardServiceStub,
    case_id: str,
    row: dict[str, Any],
    commands: list[str],
    reward: float,
) -> None:
    caller = Caller(stub)
    episode = caller.open("terminal", row)
    assert [t.name for t in episode.tools] == ["bash"]
    for command in commands:
        result = caller.step(episode.episode_id, ("bash", {"command": command})).results[0]
        assert not result.error, result.content
        assert result.content.startswith("exit code: "), result.content
    score = caller.close(episode.episode_id, "done")
    assert score.failure_kind == 0, score.failure_reason
    assert score.reward == reward, dict(score.info)


def test_terminal_output_and_state(stub: reward_pb2_grpc.RewardServiceStub) -> None:
    caller = Caller(stub)
    episode = caller.open("terminal", SORT)
    listing, flood, grow, endless, after = caller.step(
        episode.episode_id,
        ("bash", {"command": "ls -R; echo oops >&2; exit 3"}),
        ("bash", {"command": "yes | head -c 5000000"}),
        ("bash", {"command": "head -c 200000 /dev/zero > big.bin; echo wrote"}),
        ("bash", {"command": "sleep 60"}),
        ("bash", {"command": "ls; cat data.txt | wc -l"}),
    ).results
    assert listing.content.startswith("exit code: 3\n") and "data.txt" in listing.content
    assert "[stderr]\noops" in listing.content and not listing.error
    assert len(flood.content) <= 2000 and "[output truncated" in flood.content
    assert grow.error and "changes to files were dropped" in grow.content
    assert "exit code: 124" in endless.content and "[timed out]" in endless.content
    assert "big.bin" not in after.content and after.content.rstrip().endswith("3")
    caller.close(episode.episode_id, abandon=True)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"files": {"a": "x"}}, "row.check"),
        ({"check": "true", "files": {"../escape": "x"}}, "row.files.../escape"),
        ({"check": "true", "files": {"/etc/passwd": "x"}}, "row.files./etc/passwd"),
        ({"check": "true", "files": {"a": 1}}, "row.files.a"),
        ({"check": "true", "files": {"big": "x" * 70000}}, "row.files"),
    ],
)
def test_terminal_row_is_checked(
    stub: reward_pb2_grpc.RewardServiceStub, row: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        Caller(stub).open("terminal", row)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field + ":"), err.value.details()
