"""`rlfleet run`: the six stages (rlvr1-3, swe1, swe2, rlhf) end to end as a user runs
them, interrupted twice and continued with --resume each time:

1. Ctrl-C in the middle of rlvr2 (exit 130, services gone, stage 1 untouched later);
2. kill -9 of the reward gateway in the middle of rlvr3 (the run stops, naming it);
3. kill -9 of the trainer in the middle of swe1 (the run fails, naming the signal);
4. `--resume` completes the pipeline.

Then checks the run folder: every stage finished from the previous stage's export
(lineage with hashes and parents), swe1's ledger is exactly the ledger of an uninterrupted
run of the same stage (synchronous GRPO issues and trains prompts in a fixed order, so
the two must match entry for entry), every stage's ledger holds every issued prompt once,
the report has every stage's measure, the GenRM win rate and the regression table, and
the RLHF stage trained against its served judge with KL to its starting weights.

The tiny random model and the hf engine keep this about the mechanics; the judge is the
small real model (a random one writes no verdict). That the default pipeline learns is
shown by a full `rlfleet run` (docs/run.md) and tests/test_learning_rlvr.py.
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

from tests.support import require_docker, swe_instance_images

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")
pytest.importorskip("rlfleet_swe", reason="the swe-runner package is not installed")

FAST = [
    "grpo.max_num_steps=2",
    "grpo.num_prompts_per_step=2",
    "grpo.num_generations_per_prompt=2",
    "grpo.num_val_prompts=2",
    "grpo.val_samples_per_prompt=2",
    # Synchronous: each step trains exactly the prompts it issued, in order.
    "grpo.max_trajectory_age_steps=0",
    "generation.max_new_tokens=8",
    "checkpoint.save_every_steps=1",
    "policy.train_micro_batch_size=4",
    "policy.logprob_micro_batch_size=4",
]
STAGES = ["rlvr1", "rlvr2", "rlvr3", "swe1", "swe2", "rlhf"]


def _rlfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlfleet_cli.main", *args]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200", **extra}


def _wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"rlfleet run exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _pids(*markers: bytes) -> list[int]:
    """Processes whose command line has every one of `markers` (from /proc)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(any(marker in arg for arg in args) for marker in markers):
            pids.append(int(proc.name))
    return pids


def _trainer_pids(stage_dir: Path) -> list[int]:
    return _pids(b"rlfleet_trainer", str(stage_dir).encode())


def _ledger(stage_dir: Path) -> list[tuple[str, str, int]]:
    rows = [json.loads(line) for line in (stage_dir / "ledger.jsonl").read_text().splitlines()]
    return [(r["prompt_id"], r["outcome"], r["step"]) for r in rows]


def _exactly_once(stage_dir: Path) -> dict[str, int]:
    from rlfleet_pipeline.recipes import load_recipe
    from rlfleet_trainer.ledger import Ledger, verify_ledger
    from rlfleet_trainer.run import build_context

    recipe = load_recipe(str(stage_dir / "recipe.yaml"))
    summary = json.loads((stage_dir / "summary.json").read_text())
    ctx = build_context(recipe, stage_dir.parent.parent / "probe" / stage_dir.name)
    ctx.source.cursor = summary["data_cursor"]
    return verify_ledger(Ledger(stage_dir / "ledger.jsonl").entries(), ctx.source.issued_ids())


def _interrupt(out: Path, hold: str, wait_for: Path, how: str) -> str:
    run = subprocess.Popen(
        _rlfleet("run", *(["--resume"] if (out / "run.json").exists() else []), "--out", str(out),
                 *([] if (out / "run.json").exists() else ["--engine", "hf", "--model", "tiny", *FAST])),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # The stage's trainer waits after its step-1 checkpoint: the interrupt lands
        # mid-stage however fast the machine is.
        env=_env(RLFLEET_TRAINER_HOLD_AT=hold),
    )  # fmt: skip
    try:
        try:
            _wait_for(lambda: any(wait_for.glob("step_*")), 900, f"a checkpoint in {wait_for}", run)
        except AssertionError as exc:
            run.kill()
            raise AssertionError(
                f"{exc}\n{run.communicate()[0].decode(errors='replace')[-3000:]}"
            ) from None
        if how == "ctrl-c":
            run.send_signal(signal.SIGINT)
        elif how == "kill-9-reward":
            ports = str(out / "logs" / "reward.ports.json").encode()
            for pid in _pids(b"rlfleet_reward", ports):
                os.kill(pid, signal.SIGKILL)
        else:
            stage_dir = wait_for.parent
            _wait_for(lambda: bool(_trainer_pids(stage_dir)), 60, "the trainer's pid", run)
            for pid in _trainer_pids(stage_dir):
                os.kill(pid, signal.SIGKILL)
        return run.communicate(timeout=180)[0].decode(errors="replace")
    finally:
        if run.poll() is None:
            run.kill()


@pytest.mark.budget(
    1500, "six stages end to end, three interruptions and a resume, plus a reference swe1 run"
)
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_six_stages_survive_ctrl_c_and_kill_9_and_resume(tmp_path: Path) -> None:
    require_docker()
    swe_instance_images()
    out = tmp_path / "run"
    stages = out / "stages"

    output = _interrupt(out, "rlvr2:after_checkpoint:1", stages / "rlvr2" / "checkpoints", "ctrl-c")
    assert f"rlfleet run --resume --out {out}" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not (stages / "rlvr2" / "summary.json").exists()
    rlvr1_metrics = (stages / "rlvr1" / "metrics.jsonl").read_text()

    output = _interrupt(
        out, "rlvr3:after_checkpoint:1", stages / "rlvr3" / "checkpoints", "kill-9-reward"
    )
    assert "stage rlvr3 stopped: reward exited with code -9" in output, output[-3000:]
    assert f"rlfleet run --resume --out {out}" in output, output[-3000:]
    assert not (stages / "rlvr3" / "summary.json").exists()

    output = _interrupt(out, "swe1:after_checkpoint:1", stages / "swe1" / "checkpoints", "kill-9")
    assert "stage swe1: the trainer was killed by SIGKILL" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert not (stages / "swe1" / "summary.json").exists()

    done = subprocess.run(
        _rlfleet("run", "--resume", "--out", str(out)),
        capture_output=True,
        env=_env(),
        timeout=1800,
    )
    output = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, output[-4000:]
    assert (stages / "rlvr1" / "metrics.jsonl").read_text() == rlvr1_metrics  # left alone

    # swe1 against an uninterrupted run of the same stage (its own fleet and folder).
    alone = tmp_path / "alone"
    reference = subprocess.run(
        _rlfleet("run", "--out", str(alone), "--engine", "hf", "--model", "tiny", "--from", "swe1",
                 "--to", "swe1", *FAST),
        capture_output=True, env=_env(), timeout=900,
    )  # fmt: skip
    assert reference.returncode == 0, (reference.stdout + reference.stderr).decode()[-3000:]
    assert _ledger(stages / "swe1") == _ledger(alone / "stages" / "swe1")
    assert json.loads((alone / "report.json").read_text())["stages"][0]["stage"] == "swe1"

    report = json.loads((out / "report.json").read_text())
    assert [s["stage"] for s in report["stages"]] == STAGES
    for index, name in enumerate(STAGES):
        stage_dir = stages / name
        counts = _exactly_once(stage_dir)
        assert sum(counts.values()) >= 2 * 2, (name, counts)  # 2 steps x 2 prompts at least
        lineage = json.loads((stage_dir / "lineage.json").read_text())
        assert lineage["stage"] == name and lineage["pipeline"] == "tiny"
        assert len(lineage["recipe_sha256"]) == 64 and lineage["code"]["packages"]["rlfleet"]
        assert lineage["data"]["val_sha256"]
        if index:
            parent = stages / STAGES[index - 1] / "hf"
            assert lineage["parent_stage"] == STAGES[index - 1]
            assert lineage["parent_model_path"] == str(parent)
            assert len(lineage["parent_weights_sha256"]) == 64
        measure = report["measures"][name]
        assert measure["outcome"].startswith(
            ("improved", "got worse", "did not move", "not measured", "within noise")
        ), measure
    assert report["measures"]["swe2"]["metric"] == "held-out resolve rate"
    win = json.loads((stages / "rlhf" / "genrm_win_rate.json").read_text())
    assert win["pairs"] + win["unjudged"] == 2 * 2  # 2 held-out prompts x 2 samples
    assert [r["stage"] for r in report["regression"]] == ["rlvr1", "rlvr2", "rlvr3", "swe1"]
    for row in report["regression"]:
        heldout = json.loads((out / "regression" / row["stage"] / "heldout.json").read_text())
        assert heldout["final"]["reward"] == row["at_end"]
    markdown = (out / "report.md").read_text()
    assert "Regressions: the final weights" in markdown and "GenRM win rate" in markdown

    # swe2's multi-turn episodes ran in docker containers and every trajectory was scored
    # (tests/test_swe2_stage.py ran the stage on its own until session 18).
    swe2_steps = [
        json.loads(line) for line in (stages / "swe2" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in swe2_steps] == [1, 2]
    for m in swe2_steps:
        assert "reward/swe_agent" in m and 0.0 <= m["reward/swe_agent"] <= 1.0, m
        assert not any(v for k, v in m.items() if k.startswith("failures/")), m

    # The RLHF stage (tests/test_rlhf_stage.py ran it on its own until session 18): the
    # judge served beside the gateway, which started after it; KL to the starting weights
    # is 0 at step 1 (trained on them) and above 0 once step 1 moved them; every step
    # reports the judge's comparisons per second.
    started = json.loads((out / "startup.json").read_text())["services"]
    assert "judge" in started and "judge" in started["reward"]["after"], started
    rlhf = stages / "rlhf"
    steps = [json.loads(line) for line in (rlhf / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert steps[0]["grad_norm"] == 0 or steps[1]["kl"] > 0, steps
    for s in steps:
        assert s["genrm/comparisons"] > 0 and s["genrm/comparisons_per_s"] > 0, s
    assert "KL" in markdown
    assert (rlhf / "hf" / "config.json").is_file()
