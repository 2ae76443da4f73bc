"""`rlfleet status` and `rlfleet ui` on folders without a live fleet: one clear line for a
folder with no services, a down service in the table and the JSON (exit code 1), and the
reward curve of a stage folder. (tests/test_fleet_ui.py runs the page on real services.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_cli.main import app
from rlfleet_core.auth import TOKEN_ENV, TOKEN_FILE_ENV
from typer.testing import CliRunner

GONE_PID = 2**22 + 4321  # above Linux's pid_max: no such process


@pytest.fixture(autouse=True)
def wide_and_tokenless(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlfleet_cli import ui

    # One table row per line. COLUMNS alone is not enough: the console is made at import,
    # and under pytest-xdist it took the worker's width (a wrapped "down (...)" cell).
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setattr(ui.out, "width", 300)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)


@pytest.fixture
def stopped_fleet(tmp_path: Path) -> Path:
    """A stage folder whose rollout has stopped (its port file names a gone process)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rollout.ports.json").write_text(
        json.dumps({"grpc": 1, "http": None, "pid": GONE_PID})
    )
    rows = [{"step": s, "reward/mean": s / 4, "reward/code": 0.5} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


@pytest.mark.parametrize("command", [["status", "--once"], ["status", "--json"], ["ui"]])
def test_a_folder_without_services_says_how_to_start_some(
    tmp_path: Path, command: list[str]
) -> None:
    result = CliRunner().invoke(app, [*command, str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "no services in" in result.output and "rlfleet up --run-dir" in result.output


def test_status_once_shows_a_down_service_and_the_reward(stopped_fleet: Path) -> None:
    result = CliRunner().invoke(app, ["status", str(stopped_fleet), "--once"])
    assert result.exit_code == 1, result.output  # not every service is SERVING
    assert f"down (process {GONE_PID} has exited)" in result.output
    assert "code (" in result.output and "0.500" in result.output  # reward per env
    assert "reward/mean over 3 steps" in result.output and "last 0.750" in result.output


def test_status_json_is_one_snapshot(stopped_fleet: Path) -> None:
    result = CliRunner().invoke(app, ["status", str(stopped_fleet), "--json"])
    assert result.exit_code == 1, result.output
    snap = json.loads(result.stdout)
    assert [(s["name"], s["health"]) for s in snap["services"]] == [("rollout", "down")]
    assert snap["reward"]["by_env"] == {"mean": 0.75, "code": 0.5}
    assert snap["trainer"]["step"] == 3
