"""`rlfleet rl rlvr -c tiny/nemotron-h` end to end on CPU, as a user runs it: the bundled
hybrid Mamba-2 / attention / MoE model through the services (reward gateway, rollout with
the hf engine the recipe names), torch backend, async GRPO with in-flight weight updates
by checkpoint name, aux-loss-free router balancing. Checks the run's summary, held-out
reward and report, the engine's logprobs against the trainer's, the expert-load metrics,
and an hf/ export that loads with AutoModelForCausalLM under the checkpoint's own names
(one tensor per expert) with router biases the balancing moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_rlfleet

pytest.importorskip("rlfleet_trainer", reason="the trainer package is not installed")
pytest.importorskip("rlfleet_rollout", reason="the rollout service package is not installed")


@pytest.mark.budget(240, "a GRPO stage of the hybrid model through its services")
@pytest.mark.timeout(900)
def test_tiny_nemotron_h_stage_runs_exports_and_balances(tmp_path: Path) -> None:
    import torch
    from rlfleet_core.models import resolve_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    prep = run_rlfleet(tmp_path, "data", "prep", "rl", "tiny-rlvr1", timeout=300)
    assert prep.returncode == 0, prep.stderr[-2000:]
    # Deadlines for a machine shared with the other workers; the test checks mechanics.
    run = run_rlfleet(
        tmp_path, "rl", "rlvr", "-c", "tiny/nemotron-h", "services.generate_timeout_s=1800",
        timeout=850,
    )  # fmt: skip
    stage = tmp_path / "runs/rlvr"
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in stage.glob("logs/*.log")
    )
    assert run.returncode == 0, run.stderr[-3000:] + logs

    summary = json.loads((stage / "summary.json").read_text())
    assert summary["step"] == 3 and summary["weight_version"] == 3
    report = json.loads((stage / "report.json").read_text())
    (result,) = report["stages"]
    assert 0.0 <= result["heldout_reward_after"] <= 1.0
    steps = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "token_mult_prob_error" in s]
    assert len(steps) == 3
    # Step 1 samples the starting weights on both sides: engine and trainer agree.
    assert steps[0]["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
    for s in steps:
        assert 0.0 < s["moe/expert_load_entropy"] <= 1.0
        assert s["moe/expert_load_max"] >= 1.0 >= s["moe/expert_load_min"] >= 0.0
    assert steps[-1]["moe/router_bias_abs_max"] == pytest.approx(3e-3)  # 3 steps at 1e-3

    exported = load_file(str(stage / "hf/model.safetensors"))
    source = load_file(str(resolve_model("tiny-nemotron-h") / "model.safetensors"))
    assert set(exported) == set(source)  # the checkpoint's names: experts one by one
    bias = "backbone.layers.1.mixer.gate.e_score_correction_bias"
    assert bool(source[bias].eq(0).all()) and not bool(exported[bias].eq(0).all())
    assert any(not torch.equal(exported[k], source[k]) for k in source if ".experts." in k)
    model = AutoModelForCausalLM.from_pretrained(stage / "hf")
    assert type(model).__name__ == "NemotronHForCausalLM"
