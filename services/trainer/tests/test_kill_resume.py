"""kill -9 at several points of a real trainer subprocess, then --resume: the ledger
must hold every issued prompt exactly once (trained or dropped with a reason), and the
run must end at the requested step. Rollout and reward are test doubles served over
gRPC by this test process, so they outlive each killed trainer (as real services do)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import load_config
from rlfleet_trainer.checkpoint import list_checkpoints
from rlfleet_trainer.data import PromptSource
from rlfleet_trainer.faults import CRASH_ENV
from rlfleet_trainer.ledger import Ledger, verify_ledger
from rlfleet_trainer.testing import serve_doubles
from transformers import AutoTokenizer

STEPS = 5


def _rows() -> list[dict[str, object]]:
    return [
        {
            "id": f"r{i}",
            "responses_create_params": {"input": [{"role": "user", "content": f"say e {i}"}]},
            "env": "letters",
        }
        for i in range(7)  # not a multiple of the step size: epochs wrap mid-step
    ]


async def _trainer(
    args: list[str], crash_at: str | None, kill_after_lines: int | None, run_dir: Path
) -> int:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    env["OMP_NUM_THREADS"] = "1"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlfleet_trainer",
        "run",
        *args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    if kill_after_lines is not None:
        ledger = run_dir / "ledger.jsonl"
        while proc.returncode is None:
            lines = ledger.read_text().count("\n") if ledger.exists() else 0
            if lines >= kill_after_lines:
                await asyncio.sleep(0.15)  # somewhere inside the following step
                proc.send_signal(signal.SIGKILL)
                break
            await asyncio.sleep(0.02)
    _, stderr = await proc.communicate()
    assert proc.returncode is not None
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(stderr.decode()[-3000:])
    return proc.returncode


@pytest.mark.slow
async def test_kill_9_at_any_point_then_resume_loses_and_duplicates_nothing(
    tiny_model: Path, tmp_path: Path
) -> None:
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    run_dir = tmp_path / "run"
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, _):
        args = [
            "--run-dir",
            str(run_dir),
            "--rows",
            str(rows_file),
            f"policy.model={tiny_model}",
            "policy.max_total_sequence_length=96",
            "policy.train_micro_batch_size=6",
            "generation.max_new_tokens=8",
            "grpo.num_prompts_per_step=3",
            "grpo.num_generations_per_prompt=2",
            f"grpo.max_num_steps={STEPS}",
            "grpo.lr=1e-3",
            "grpo.max_trajectory_age_steps=1",
            f"services.rollout={rollout_target}",
            f"services.reward={reward_target}",
            "checkpoint.save_every_steps=2",
            "checkpoint.export_hf=false",
        ]
        codes = [
            # inside step 2's checkpoint write, after step 2's outcomes hit the ledger:
            # no complete checkpoint exists, the resume starts over and cuts the ledger
            await _trainer(args, "checkpoint_before_rename:2", None, run_dir),
            # killed from outside at an arbitrary moment after a few ledger lines
            await _trainer([*args, "--resume"], None, 5, run_dir),
            await _trainer([*args, "--resume"], None, None, run_dir),
        ]
    assert codes[0] == -signal.SIGKILL
    assert codes[-1] == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == STEPS
    # weight versions only ever grew on the rollout side, across all restarts
    assert rollout.updates == sorted(set(rollout.updates))

    recipe = load_config(RecipeConfig, overrides=[f"policy.model={tiny_model}"])
    source = PromptSource(_rows(), AutoTokenizer.from_pretrained(tiny_model), seed=recipe.grpo.seed)
    source.cursor = summary["data_cursor"]
    counts = verify_ledger(Ledger(run_dir / "ledger.jsonl").entries(), source.issued_ids())
    assert counts["trained"] == STEPS * 3
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == STEPS
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints")][-1] == f"step_{STEPS}"
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
