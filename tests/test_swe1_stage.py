"""`rlfleet rl swe -c tiny/swe1` runs end to end on CPU: the pivot rows prepared from the
bundled demonstrations (`python -m rlfleet_dataprep.swe_pivot`), the stage started from
the previous stage's export (`runs/rlvr3/hf`, as super3/swe1 chains; here the tiny random
model stands in for tiny/rlvr3's export), real local services on the hf engine, the
`swe_pivot` env scoring every sample. It must train its steps on prompts it issued,
validate before and after on the held-out instance's turns and write its stage files
(summary, held-out reward, metrics, lineage, export). The rewards are whatever the model
earns, 0 or 1 each (tests/test_swe1_scripted.py shows the scoring path with a policy that
writes the demonstrated calls).

Until session 14 SmolLM2 stood in, for ~300 s a run (each step's update of 8 samples of up
to 1,024 tokens on the hf backend) and the same 0 rewards; the tiny model takes ~60 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_dataprep.swe_pivot import prepare_swe_pivot

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")

FAST = [
    "grpo.max_num_steps=2",
    "grpo.num_prompts_per_step=2",
    "grpo.num_val_prompts=4",
    "grpo.val_samples_per_prompt=1",
    "generation.max_new_tokens=16",
    # The tiny model's 512-token vocabulary spells the demonstrations in ~2x SmolLM2's
    # tokens; the rollout serves the recipe's length (`rlfleet rl` passes it on).
    "policy.max_total_sequence_length=2048",
    "checkpoint.save_every_steps=0",
]


@pytest.mark.budget(180, "a tiny swe1 stage with its services")
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_tiny_swe1_stage_runs_from_the_previous_export(tmp_path: Path) -> None:
    from rlfleet_core.models import resolve_model

    out_dir, manifest = prepare_swe_pivot(tmp_path / "data")
    assert out_dir == tmp_path / "data" / "tiny-swe1"  # where tiny/swe1 reads its rows
    export = tmp_path / "runs" / "rlvr3" / "hf"
    export.parent.mkdir(parents=True)
    export.symlink_to(resolve_model("tiny"), target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-m", "rlfleet_cli.main", "rl", "swe", "-c", "tiny/swe1",
         "--engine", "hf", *FAST],
        cwd=tmp_path, capture_output=True, text=True, timeout=1400,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stage = tmp_path / "runs" / "swe1"
    assert json.loads((stage / "summary.json").read_text())["step"] == 2
    lineage = json.loads((stage / "lineage.json").read_text())
    assert lineage["parent_model"] == "runs/rlvr3/hf"
    heldout = json.loads((stage / "heldout.json").read_text())
    assert {"before", "after"} <= set(heldout), heldout
    held_out_ids = {
        json.loads(line)["id"] for line in (out_dir / "val" / "data.jsonl").read_text().splitlines()
    }
    assert manifest.splits["val"]["rows"] == len(held_out_ids)
    for label in ("before", "after"):
        samples = [
            json.loads(line) for line in (stage / f"heldout_{label}.jsonl").read_text().splitlines()
        ]
        assert len(samples) == 4
        assert all(s["reward"] in (0.0, 1.0) for s in samples), samples
    ledger = [json.loads(line) for line in (stage / "ledger.jsonl").read_text().splitlines()]
    trained = {row["step"] for row in ledger if row["outcome"] == "trained"}
    assert trained == {1, 2}, ledger  # none dropped as too long for the served length
    steps = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert len([s for s in steps if "step" in s]) >= 2
    assert (stage / "hf" / "config.json").is_file()
    print(json.dumps({"heldout": heldout, "steps": steps[-1]})[:2000])
