"""`rlfleet rl swe -c tiny/swe2` as a user starts it: the tiny-swe2 blend prepared (one
instance held out), and the stage refused until the previous stage's export is in
runs/swe1/hf.

The stage itself (the reward gateway wired to the swe-runner, multi-turn swe_agent
episodes in real docker containers, two GRPO steps, every trajectory scored, the report)
runs in tests/test_six_stages.py after swe1, from swe1's export; its own run here (~100 s
beside the other workers) was folded into that one in session 18. The tiny model fixes
nothing (nor calls a tool: tests/test_swe2_scripted_policy.py drives episodes whose calls
run in the containers)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rlfleet_core.models import resolve_model
from support import run_rlfleet

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_swe", reason="the swe-runner package is not installed")


def test_rl_swe_tiny_swe2_needs_the_previous_stages_export(tmp_path: Path) -> None:
    prep = run_rlfleet(tmp_path, "data", "prep", "rl", "tiny-swe2", "--val-rows", "1", timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    missing = run_rlfleet(tmp_path, "rl", "swe", "-c", "tiny/swe2", "--dry-run", timeout=300)
    assert missing.returncode == 1 and "runs/swe1/hf: no such folder" in missing.stderr
    shutil.copytree(resolve_model("tiny"), tmp_path / "runs/swe1/hf")
    ready = run_rlfleet(tmp_path, "rl", "swe", "-c", "tiny/swe2", "--dry-run", timeout=300)
    assert "runs/swe1/hf: no such folder" not in ready.stdout + ready.stderr, ready.stderr
