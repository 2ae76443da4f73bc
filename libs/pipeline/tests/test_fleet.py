from __future__ import annotations

from pathlib import Path

import pytest
from rlfleet_core.client import check_health
from rlfleet_core.processes import pid_alive
from rlfleet_pipeline.fleet import FleetError, LocalFleet


def test_fleet_starts_in_order_serves_and_stops_cleanly(tmp_path: Path) -> None:
    fleet = LocalFleet(["trainer", "swe-runner"], tmp_path)
    with fleet:
        assert list(fleet.processes) == ["swe-runner", "trainer"]  # dependency order
        for name in fleet.processes:
            assert check_health(fleet.target(name)) == "SERVING"
        pids = [p.process.pid for p in fleet.processes.values()]
    assert {p.process.returncode for p in fleet.processes.values()} == {0}  # graceful SIGTERM
    assert not any(pid_alive(pid) for pid in pids)
    assert "msg=stopped" in (tmp_path / "logs" / "trainer.log").read_text()


def test_a_service_that_dies_while_starting_is_reported_with_its_log(tmp_path: Path) -> None:
    fleet = LocalFleet(["trainer"], tmp_path, overrides={"trainer": ["server.grace_s=soon"]})
    with pytest.raises(FleetError) as info:
        fleet.start()
    assert "trainer exited with code 2 while starting" in str(info.value)
    assert "server.grace_s: expected a number" in str(info.value)


def test_unknown_service_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="unknown service"):
        LocalFleet(["nope"], tmp_path)


def test_reward_gateway_is_wired_to_the_fleets_sandbox(tmp_path: Path) -> None:
    """`code` rows score through the sandbox the fleet started (not SANDBOX_ERROR)."""
    import json

    from rlfleet_core.client import connect_sync
    from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

    pytest.importorskip("rlfleet_reward")
    pytest.importorskip("rlfleet_sandbox")
    row = {
        "prompt": "def add(a, b):\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
        "entry_point": "add",
    }
    with LocalFleet(["reward", "sandbox"], tmp_path) as fleet:
        channel = connect_sync(fleet.target("reward"), default_timeout_s=60)
        stub = reward_pb2_grpc.RewardServiceStub(channel)
        results = {}
        for name, code in (("right", "return a + b"), ("wrong", "return a - b")):
            text = f"```python\ndef add(a, b):\n    {code}\n```\n"
            results[name] = stub.Score(
                reward_pb2.ScoreRequest(
                    request_id=name,
                    env="code",
                    row_json=json.dumps(row),
                    response=reward_pb2.Response(text=text),
                ),
                timeout=60,
            )
        channel.close()
    assert results["right"].failure_kind == reward_pb2.FAILURE_KIND_NONE, results["right"]
    assert (results["right"].reward, results["wrong"].reward) == (1.0, 0.0)
