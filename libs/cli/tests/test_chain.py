"""Recipe chains are real: two tiny stages run one after the other with `rlfleet rl`, the
second starting from the path a super3 recipe names for its predecessor
(`runs/<previous stage>/hf`, the trainer's export under `rlfleet rl`'s default run
folder). Real local services (sandbox, reward, rollout on the hf engine), the tiny model.

The weights check: stage 1's export gets a marker (its final norm set to 3.0; the tiny
model's is 1.0) before stage 2 starts, so stage 2's own export carries it only if stage 2
trained from that folder and not from anything else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_dataprep.prep import PrepOptions, prepare_rl
from rlfleet_pipeline.recipes import load_recipe

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")

FAST = [
    "grpo.max_num_steps=2",
    "grpo.num_val_prompts=4",
    "generation.max_new_tokens=8",
    "checkpoint.save_every_steps=0",
]
MARKER_TENSOR = "model.norm.weight"


def rlfleet_rl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet_cli.main", "rl", "rlvr", "--engine", "hf", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"},
    )


@pytest.mark.budget(240, "two `rlfleet rl` stages, each starting its own services")
@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_stage_two_starts_from_stage_ones_export(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    for blend in ("tiny-rlvr1", "tiny-rlvr2"):  # where the tiny recipes read their rows
        prepare_rl(blend, PrepOptions(out=tmp_path / "data", val_rows=8, force=True))

    first = rlfleet_rl(tmp_path, "-c", "tiny/rlvr1", "policy.model=tiny", *FAST)
    assert first.returncode == 0, first.stdout + first.stderr
    export = tmp_path / "runs" / "rlvr1" / "hf"
    weights = export / "model.safetensors"
    state = load_file(str(weights))
    # Trained from the tiny model, whose final norm is 1.0: near it, far from the marker.
    assert torch.allclose(state[MARKER_TENSOR], torch.ones_like(state[MARKER_TENSOR]), atol=0.05)
    state[MARKER_TENSOR] = torch.full_like(state[MARKER_TENSOR], 3.0)
    save_file(state, str(weights), metadata={"format": "pt"})

    chained = load_recipe("super3/rlvr2").policy.model  # the super3 chain's own path
    assert chained == "runs/rlvr1/hf"
    second = rlfleet_rl(
        tmp_path, "-c", "tiny/rlvr2", f"policy.model={chained}", *FAST, "grpo.max_num_steps=1"
    )
    assert second.returncode == 0, second.stdout + second.stderr

    stage2 = tmp_path / "runs" / "rlvr2"
    lineage = json.loads((stage2 / "lineage.json").read_text())
    assert lineage["parent_model"] == "runs/rlvr1/hf"
    assert lineage["parent_model_path"] == str(export.resolve())
    assert lineage["output"]["hf"] == str((stage2 / "hf").resolve())
    assert json.loads((stage2 / "recipe.json").read_text())["policy"]["model"] == chained
    assert json.loads((stage2 / "summary.json").read_text())["step"] == 1

    trained = load_file(str(stage2 / "hf" / "model.safetensors"))
    # One small step (lr 3e-5) moves the marker by far less than the 2.0 it stands out by.
    assert torch.allclose(trained[MARKER_TENSOR], state[MARKER_TENSOR], atol=0.05)
    assert set(trained) == set(state)
    for name, tensor in state.items():
        assert torch.allclose(trained[name], tensor, atol=0.05), name
