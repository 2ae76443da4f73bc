"""`LocalFleet.change`: a pipeline's next stage gets its services without restarting the
ones it keeps as they were (real processes; the swe-runner and the sandbox start in about
a second, the reward gateway is wired to both)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlfleet_core.client import check_health
from rlfleet_core.processes import pid_alive
from rlfleet_pipeline.fleet import FleetError, LocalFleet

pytest.importorskip("rlfleet_reward")
pytest.importorskip("rlfleet_sandbox")
pytest.importorskip("rlfleet_swe")


def _pids(fleet: LocalFleet) -> dict[str, int]:
    return {name: proc.process.pid for name, proc in fleet.processes.items()}


@pytest.mark.budget(180, "a local fleet of services started, changed twice")
def test_change_adds_stops_and_rewires_only_what_changed(tmp_path: Path) -> None:
    lines: list[str] = []
    with LocalFleet(["sandbox", "reward"], tmp_path, say=lines.append) as fleet:
        first = _pids(fleet)
        # Same services, same overrides: nothing restarts.
        assert fleet.change(["sandbox", "reward"], {}) == []
        assert _pids(fleet) == first
        # A swe-runner comes: it starts, and the gateway restarts wired to it; the sandbox
        # keeps running.
        assert fleet.change(["sandbox", "reward", "swe-runner"], {}) == ["reward", "swe-runner"]
        second = _pids(fleet)
        assert second["sandbox"] == first["sandbox"] and second["reward"] != first["reward"]
        assert not pid_alive(first["reward"])
        reward_log = (tmp_path / "logs" / "reward.log").read_text()
        assert f"swe.target={fleet.target('swe-runner')}" in " ".join(
            fleet.processes["reward"].process.args  # type: ignore[arg-type]
        ), reward_log[-2000:]
        # Other overrides for the gateway: only it restarts.
        assert fleet.change(
            ["sandbox", "reward", "swe-runner"], {"reward": ["limits.max_request_bytes=2000000"]}
        ) == ["reward"]
        third = _pids(fleet)
        assert third["swe-runner"] == second["swe-runner"]
        # The swe-runner and the sandbox go: stopped, the gateway rewired without them.
        assert fleet.change(["reward"], fleet.overrides) == ["reward"]
        assert list(fleet.processes) == ["reward"]
        assert not pid_alive(third["swe-runner"]) and not pid_alive(third["sandbox"])
        assert check_health(fleet.target("reward")) == "SERVING"
        assert "sandbox.target" not in " ".join(fleet.processes["reward"].process.args)  # type: ignore[arg-type]
    assert any(line.startswith("fleet: stopped") for line in lines)


def test_a_change_that_fails_stops_the_fleet(tmp_path: Path) -> None:
    fleet = LocalFleet(["swe-runner"], tmp_path, say=lambda _: None)
    with fleet:
        runner = fleet.processes["swe-runner"].process.pid
        with pytest.raises(FleetError, match="trainer exited with code 2 while starting"):
            fleet.change(["swe-runner", "trainer"], {"trainer": ["server.grace_s=soon"]})
        assert not pid_alive(runner)
    with pytest.raises(FleetError, match="unknown service"):
        LocalFleet(["swe-runner"], tmp_path).change(["nope"], {})
