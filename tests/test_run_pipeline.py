"""`rlfleet run` end to end, as a user runs it: three stages against real local services
(sandbox, reward gateway, rollout), interrupted with Ctrl-C in the middle of stage 2 and
continued with --resume. Checks the run folder: report.json per stage, stage 1 untouched
by the resume, each stage starting from the previous stage's export (lineage), every
prompt of every stage in its ledger exactly once, services gone after the interrupt.

The tiny random model and the hf engine keep this about the mechanics and fast; that
SmolLM2 learns on the default pipeline is tests/test_learning_rlvr.py's job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")

FAST = [
    "grpo.max_num_steps=3",
    "grpo.num_val_prompts=4",
    "generation.max_new_tokens=8",
    "checkpoint.save_every_steps=1",
]


def _rlfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlfleet_cli.main", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}


def _wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"rlfleet run exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _ledger_counts(stage_dir: Path) -> dict[str, int]:
    """Every prompt the stage issued is in its ledger exactly once."""
    from rlfleet_pipeline.recipes import load_recipe
    from rlfleet_trainer.ledger import Ledger, verify_ledger
    from rlfleet_trainer.run import build_context

    recipe = load_recipe(str(stage_dir / "recipe.yaml"))
    summary = json.loads((stage_dir / "summary.json").read_text())
    ctx = build_context(recipe, stage_dir / "probe")
    ctx.source.cursor = summary["data_cursor"]
    return verify_ledger(Ledger(stage_dir / "ledger.jsonl").entries(), ctx.source.issued_ids())


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three CPU stages and a resume: minutes, not seconds
def test_run_interrupt_and_resume(tmp_path: Path) -> None:
    from rlfleet_trainer.loop import HOLD_ENV

    out = tmp_path / "run"
    first = subprocess.Popen(
        _rlfleet("run", "--out", str(out), "--engine", "hf", "--model", "tiny", *FAST),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # Stage 2's trainer waits after its step-1 checkpoint, so Ctrl-C lands mid-stage
        # (on a fast machine the stage otherwise finished before the signal arrived).
        env={**_env(), HOLD_ENV: "rlvr2:after_checkpoint:1"},
    )
    try:
        checkpoints = out / "stages" / "rlvr2" / "checkpoints"
        _wait_for(lambda: any(checkpoints.glob("step_*")), 600, "a stage-2 checkpoint", first)
        first.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does
        output = first.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, output
    assert f"rlfleet run --resume --out {out}" in output
    assert "Traceback" not in output
    assert not (out / "stages" / "rlvr2" / "summary.json").exists()
    stage1_metrics = (out / "stages" / "rlvr1" / "metrics.jsonl").read_text()

    second = subprocess.run(
        _rlfleet("run", "--resume", "--out", str(out)),
        capture_output=True,
        env=_env(),
        timeout=900,
    )
    output = (second.stdout + second.stderr).decode(errors="replace")
    assert second.returncode == 0, output
    assert "held-out" in output and "report:" in output

    # stage 1 was finished: --resume left it alone
    assert (out / "stages" / "rlvr1" / "metrics.jsonl").read_text() == stage1_metrics
    report = json.loads((out / "report.json").read_text())
    assert [s["stage"] for s in report["stages"]] == ["rlvr1", "rlvr2", "rlvr3"]
    for stage in report["stages"]:
        assert stage["steps"] == 3
        for key in ("heldout_reward_before", "heldout_reward_after"):
            assert 0.0 <= stage[key] <= 1.0, (key, stage)
        counts = _ledger_counts(out / "stages" / stage["stage"])
        assert counts["trained"] >= 3 * 4, counts  # 3 steps x 4 prompts at least
    lineage = json.loads((out / "stages" / "rlvr2" / "lineage.json").read_text())
    assert lineage["parent_model"] == str(out / "stages" / "rlvr1" / "hf")
    assert (out / "stages" / "rlvr3" / "hf" / "model.safetensors").exists()
    assert (out / "report.md").exists()
    assert {p.name for p in (out / "plots").iterdir()} >= {"heldout.png", "rlvr1_reward.png"}
