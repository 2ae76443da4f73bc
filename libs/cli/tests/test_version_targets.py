"""`rlfleet version <host:port> ...` asks running services what build they are (real
service processes on loopback; the 0.1 fallback is shown in tests/test_upgrades.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from rlfleet_core.client import check_health
from rlfleet_core.ports import pick_free_port
from rlfleet_core.versions import git_commit, package_version

RLFLEET = str(Path(sys.executable).parent / "rlfleet")


def test_version_asks_each_running_service_and_names_the_unreachable(tmp_path: Path) -> None:
    port, closed = pick_free_port(), pick_free_port()
    log = tmp_path / "swe.log"
    serving = subprocess.Popen(
        [RLFLEET, "serve", "swe-runner", "--port", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert serving.poll() is None, log.read_text()
            try:
                if check_health(f"127.0.0.1:{port}", timeout_s=1.0) == "SERVING":
                    break
            except Exception:
                time.sleep(0.2)
        result = subprocess.run(
            [RLFLEET, "version", f"127.0.0.1:{port}", f"127.0.0.1:{closed}"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )
    finally:
        serving.terminate()
        serving.wait(30)
    assert result.returncode == 1, result.stdout + result.stderr  # one target is down
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    swe = [cell.strip() for cell in rows[f"127.0.0.1:{port}"].split("│")[1:-1]]
    commit = git_commit()[:12] or "unknown"
    versions = [package_version("rlfleet-swe"), package_version("rlfleet-proto")]
    assert swe[1:] == ["swe-runner", *versions, commit], swe
    assert "UNAVAILABLE" in rows[f"127.0.0.1:{closed}"]
