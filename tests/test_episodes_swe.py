"""Cross-service: the `swe_agent` multi-turn environment (stage SWE2) through the real reward
gateway and swe-runner services (each its own process on loopback) and real docker.

A scripted agent works in the instance's container over OpenEpisode / Step / CloseEpisode:
the gold fix applied with bash and submitted scores 1; looking around and submitting
nothing scores 0; a fix applied but never submitted is scored from the work tree (1);
hostile commands (a fork bomb, reaching the network, writing the host) are contained and
score 0; abandoning closes the session's container; a missing runner or image is a clear
error, and a runner that dies mid-episode is a SANDBOX_ERROR failure, never a silent 0.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_swe.images import bundled_instances_dir
from support import require_docker, start_service, stop_service, swe_instance_images

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services/reward/tests"))
from episode_support import Caller

SMALL_RUNNER = [
    "eval.test_timeout_s=120",
    "eval.memory_bytes=268435456",
    "eval.cpus=1",
    "eval.pids_limit=64",
    "eval.docker_call_timeout_s=60",
]


def _rows() -> list[dict[str, Any]]:
    lines = (bundled_instances_dir() / "instances.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _labelled(label: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=rlfleet.swe.runner={label}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.split()


def _start_pair(tmp: Path, label: str) -> tuple[Any, Any, str]:
    runner, runner_target = start_service(
        "rlfleet_swe", [*SMALL_RUNNER, f"eval.runner_label={label}"], tmp / "swe.log"
    )
    reward, reward_target = start_service(
        "rlfleet_reward",
        [
            "environments=[math]",
            "pool.workers=1",
            f"swe.target={runner_target}",
            "swe.memory_bytes=268435456",
            "swe.test_timeout_s=120",
            "swe.command_timeout_s=20",
            "episodes.tool_timeout_s=60",
            "episodes.close_timeout_s=200",
            "episodes.max_output_chars=4000",
        ],
        tmp / "reward.log",
    )
    return runner, reward, reward_target


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Caller, str]]:
    require_docker()
    swe_instance_images()
    tmp = tmp_path_factory.mktemp("episodes-swe")
    label = f"swe-ep-{secrets.token_hex(4)}"
    runner, reward, target = _start_pair(tmp, label)
    try:
        with grpc.insecure_channel(target) as channel:
            yield Caller(reward_pb2_grpc.RewardServiceStub(channel)), label
    finally:
        stop_service(reward)
        stop_service(runner)
    assert _labelled(label) == [], "containers left behind"


def _apply(patch: str) -> tuple[str, dict[str, str]]:
    return ("bash", {"command": f"git apply <<'RLFLEET_EOF'\n{patch}RLFLEET_EOF\n"})


HOSTILE = [
    (
        "bash",
        {"command": "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 3)\""},
    ),
    ("bash", {"command": "echo pwned > /host_escape; ls /var/run/docker.sock"}),
    # The pids cap stops it; whatever it left is killed when the call ends (the runner
    # kills every process of the container but PID 1), so later commands still work.
    ("bash", {"command": "f(){ f|f& }; f; sleep 2; echo survived"}),
]


def _cases() -> list[Any]:
    rows = _rows()
    cases = [
        pytest.param(
            row,
            [
                _apply(row["patch"]),
                ("bash", {"command": "git status --short"}),
                ("view", {"path": "."}),
                ("submit", {}),
            ],
            1.0,
            id=f"gold-{row['instance_id']}",
        )
        for row in rows
    ]
    first = rows[0]
    cases += [
        pytest.param(
            first,
            [("bash", {"command": "ls"}), ("view", {"path": "."}), ("submit", {})],
            0.0,
            id="no-fix",
        ),
        pytest.param(
            first,
            [_apply(first["patch"]), ("bash", {"command": "git diff --stat"})],
            1.0,
            id="fixed-not-submitted",
        ),
        pytest.param(first, [*HOSTILE, ("submit", {})], 0.0, id="hostile"),
    ]
    return cases


@pytest.mark.parametrize(("row", "calls", "reward"), _cases())
def test_scripted_agent(
    services: tuple[Caller, str], row: dict[str, Any], calls: list[Any], reward: float
) -> None:
    caller, _ = services
    episode = caller.open("swe_agent", row)
    assert [t.name for t in episode.tools] == ["bash", "view", "edit", "submit"]
    done = False
    for call in calls:
        step = caller.step(episode.episode_id, call)
        done = step.done
        if call[0] == "bash" and call not in HOSTILE:
            assert not step.results[0].error, step.results[0].content
    assert done == (calls[-1][0] == "submit")  # also after the fork bomb
    result = caller.close(episode.episode_id)
    assert result.failure_kind == reward_pb2.FAILURE_KIND_NONE, result.failure_reason
    assert result.reward == reward, dict(result.info)


def test_hostile_commands_do_not_reach_out(services: tuple[Caller, str]) -> None:
    caller, _ = services
    episode = caller.open("swe_agent", _rows()[0])
    net, host, bomb = (caller.step(episode.episode_id, c).results[0] for c in HOSTILE)
    assert "exit code: 1\n" in net.content and "unreachable" in net.content, net.content
    assert "exit code: 0" not in host.content, host.content
    assert not Path("/host_escape").exists()
    assert "Resource temporarily unavailable" in bomb.content, bomb.content  # the pids cap
    # Nothing of the bomb outlived its call: the session forks again, few processes run.
    ps = caller.step(episode.episode_id, ("bash", {"command": "ls /proc | grep -c '^[0-9]'"}))
    content = ps.results[0].content
    assert content.startswith("exit code: 0\n") and int(content.split()[-1]) <= 6, content
    caller.close(episode.episode_id, abandon=True)


def test_edit_errors_and_abandon(services: tuple[Caller, str]) -> None:
    caller, label = services
    before = len(_labelled(label))
    episode = caller.open("swe_agent", _rows()[0])
    assert len(_labelled(label)) == before + 1
    step = caller.step(
        episode.episode_id,
        ("edit", {"path": "nope.py", "old_str": "x", "new_str": "y"}),
        ("edit", {"path": "README.md"}),
        ("shell", {"command": "ls"}),
    )
    assert [r.error for r in step.results] == [True, True, True]
    assert "new_str" in step.results[1].content and "shell" in step.results[2].content
    caller.close(episode.episode_id, abandon=True)
    assert len(_labelled(label)) == before


def test_bad_rows_name_the_field(services: tuple[Caller, str]) -> None:
    caller, _ = services
    row = _rows()[0]
    for bad, field in [
        ({**row, "FAIL_TO_PASS": "not json"}, "row.FAIL_TO_PASS"),
        ({k: v for k, v in row.items() if k != "image"}, "row.image"),
        ({**row, "workdir": "testbed"}, "row.workdir"),
        ({**row, "image": "rlfleet/swe-tiny:no-such-image"}, "row.instance"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            caller.open("swe_agent", bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (caught.value.details() or ""), caught.value.details()


def test_a_runner_lost_mid_episode_is_a_failure_not_a_zero(tmp_path: Path) -> None:
    require_docker()
    swe_instance_images()
    label = f"swe-ep-{secrets.token_hex(4)}"
    runner, reward, target = _start_pair(tmp_path, label)
    try:
        with grpc.insecure_channel(target) as channel:
            caller = Caller(reward_pb2_grpc.RewardServiceStub(channel))
            row = _rows()[0]
            episode = caller.open("swe_agent", row)
            caller.step(episode.episode_id, _apply(row["patch"]))
            stop_service(runner)
            step = caller.step(episode.episode_id, ("bash", {"command": "ls"}))
            assert step.results[0].error
            result = caller.close(episode.episode_id)
            assert result.failure_kind == reward_pb2.FAILURE_KIND_SANDBOX_ERROR, result
            assert "swe-runner" in result.failure_reason
    finally:
        stop_service(reward)
        stop_service(runner)
    assert _labelled(label) == [], "containers left behind"
