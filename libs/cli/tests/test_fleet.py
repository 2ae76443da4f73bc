from __future__ import annotations

import os
from pathlib import Path

import pytest
from rlfleet_cli.fleet import FleetError, LocalFleet
from rlfleet_core.client import check_health


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_fleet_starts_in_order_serves_and_stops_cleanly(tmp_path: Path) -> None:
    fleet = LocalFleet(["trainer", "swe-runner"], tmp_path)
    with fleet:
        assert list(fleet.processes) == ["swe-runner", "trainer"]  # dependency order
        for name in fleet.processes:
            assert check_health(fleet.target(name)) == "SERVING"
        pids = [p.process.pid for p in fleet.processes.values()]
    assert {p.process.returncode for p in fleet.processes.values()} == {0}  # graceful SIGTERM
    assert not any(alive(pid) for pid in pids)
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
