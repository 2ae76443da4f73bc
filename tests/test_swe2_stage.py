"""`rlfleet rl swe -c tiny/swe2` end to end on CPU, as a user runs it: the tiny-swe2 blend
prepared (one instance held out), the previous stage's export in runs/swe1/hf (here a copy
of the tiny random model stands in for SWE1's; until session 14 SmolLM2 did, for ~300 s a
run and the same 0 rewards), the stage's services started by the
pipeline (the reward gateway wired to the swe-runner), multi-turn swe_agent episodes in
real docker containers, two GRPO steps, and the stage's report. The tiny model fixes
nothing (nor calls a tool: tests/test_swe2_scripted_policy.py drives episodes whose calls
run in the containers): this checks that the stage runs, scores every trajectory (no
failures hidden as zeros), trains and reports. (That the runner removes its containers is the
swe-runner's own tests' job; a check here would see other runs' containers.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_core.models import resolve_model
from support import require_docker

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_swe", reason="the swe-runner package is not installed")


def _rlfleet(cwd: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "rlfleet_cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_rl_swe_tiny_swe2_runs_scores_trains_and_reports(tmp_path: Path) -> None:
    require_docker()
    from rlfleet_swe.images import build_images

    build_images()
    prep = _rlfleet(tmp_path, "data", "prep", "rl", "tiny-swe2", "--val-rows", "1", timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    missing = _rlfleet(tmp_path, "rl", "swe", "-c", "tiny/swe2", "--dry-run", timeout=300)
    assert missing.returncode == 1 and "runs/swe1/hf: no such folder" in missing.stderr
    shutil.copytree(resolve_model("tiny"), tmp_path / "runs/swe1/hf")

    run = _rlfleet(tmp_path, "rl", "swe", "-c", "tiny/swe2", "--engine", "hf", timeout=1500)
    stage = tmp_path / "runs/swe2"
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in stage.glob("logs/*.log")
    )
    assert run.returncode == 0, run.stderr[-3000:] + logs
    metrics = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert "reward/swe_agent" in m and 0.0 <= m["reward/swe_agent"] <= 1.0, m
        assert not any(v for k, v in m.items() if k.startswith("failures/")), m
    report = json.loads((stage / "report.json").read_text())
    assert (stage / "report.md").is_file()
    (result,) = report["stages"]
    assert result["stage"] == "swe2" and result["steps"] == 2
    assert 0.0 <= result["heldout_reward_after"] <= 1.0
    lineage = json.loads((stage / "lineage.json").read_text())
    assert "runs/swe1/hf" in json.dumps(lineage)
