"""`rlfleet rl rlhf -c tiny/rlhf` runs end to end on CPU: the bundled tiny-rlhf blend
prepared (`prepare_rl`, the reward gateway's row check), the stage started from the
previous stage's export (`runs/rlvr3/hf`; here SmolLM2 stands in for tiny/rlvr3's export,
as in test_swe1_stage.py), real local services on the hf engine — the policy's rollout,
the reward gateway and a second rollout serving the judge (the recipe's SmolLM2, its
answers started with `{"score_1": `; RLFLEET_RLHF_JUDGE names another), which
`rlfleet rl` starts from the recipe's `judge` section and wires to the gateway — and
GRPO with KL 1e-4 to the starting weights. It must train its steps and write its report;
the KL metric is 0 at step 1 (the batch is trained on the starting weights) and above 0
after once step 1 moved the weights; every step reports the judge's comparisons per
second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout package is not installed")
pytest.importorskip("rlfleet_reward", reason="the reward package is not installed")


def test_bundled_blend_is_the_generators_and_passes_the_row_check(tmp_path: Path) -> None:
    import random

    from rlfleet_dataprep.blends.make_bundled import BLENDS, HERE
    from rlfleet_dataprep.blends.rlhf import rlhf_rows
    from rlfleet_dataprep.prep import PrepOptions, prepare_rl

    assert rlhf_rows(128, seed=17) == list(BLENDS["tiny-rlhf"])
    rows = list(BLENDS["tiny-rlhf"])
    random.Random(0).shuffle(rows)  # as make_bundled.main does
    bundled = [json.loads(line) for line in (HERE / "tiny-rlhf.jsonl").read_text().splitlines()]
    assert bundled == json.loads(json.dumps(rows, sort_keys=True))
    _, manifest = prepare_rl("tiny-rlhf", PrepOptions(out=tmp_path, val_rows=16))
    assert manifest.options["row_check"] == "reward environments"
    assert (manifest.splits["train"]["rows"], manifest.splits["val"]["rows"]) == (112, 16)
    for row in bundled:
        assert row["agent_ref"] == {"name": "genrm_compare"} and len(row["principles"]) == 2


FAST = [
    "grpo.max_num_steps=2",
    "grpo.num_prompts_per_step=2",
    "grpo.num_val_prompts=2",
    "checkpoint.save_every_steps=0",
]


JUDGE = os.environ.get("RLFLEET_RLHF_JUDGE", "")
"""Another judge model (a folder or HF id) than the recipe's SmolLM2-135M."""


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_tiny_rlhf_stage_trains_with_kl_against_a_served_judge(tmp_path: Path) -> None:
    from rlfleet_core.models import resolve_model
    from rlfleet_dataprep.prep import PrepOptions, prepare_rl

    prepare_rl("tiny-rlhf", PrepOptions(out=tmp_path / "data", val_rows=16))
    export = tmp_path / "runs" / "rlvr3" / "hf"
    export.parent.mkdir(parents=True)
    export.symlink_to(resolve_model("smollm2-135m-instruct"), target_is_directory=True)
    done = subprocess.run(
        [sys.executable, "-m", "rlfleet_cli.main", "rl", "rlhf", "-c", "tiny/rlhf",
         "--engine", "hf", *FAST, *([f"judge.model={JUDGE}"] if JUDGE else [])],
        cwd=tmp_path, capture_output=True, text=True, timeout=1400,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stage = tmp_path / "runs" / "rlhf"
    report = json.loads((stage / "report.json").read_text())["stages"][0]
    assert report["stage"] == "rlhf" and report["steps"] == 2
    assert json.loads((stage / "lineage.json").read_text())["parent_model"] == "runs/rlvr3/hf"
    started = json.loads((stage / "startup.json").read_text())["services"]
    assert set(started) == {"reward", "rollout", "judge"}
    assert started["reward"]["after"] == ["judge"]
    steps = [s for s in map(json.loads, (stage / "metrics.jsonl").read_text().splitlines())]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the starting weights: π = π_ref
    # Step 1 moved the weights when its groups had reward spread (the judge's scores
    # differed); then step 2's policy differs from the reference.
    assert steps[0]["grad_norm"] == 0 or steps[1]["kl"] > 0
    for s in steps:
        assert s["genrm/comparisons"] > 0 and s["genrm/comparisons_per_s"] > 0
    assert "KL" in (stage / "report.md").read_text()
    assert (stage / "hf" / "config.json").is_file()
    print(json.dumps({"report": report, "steps": steps})[:3000])
