"""The DPO stage's wiring in one process: scripted trajectories (one valid, one with an
unknown tool) through the agent loop and the episode double over real gRPC, the held-out
hallucination rate before and after, pairs, DPO steps on the torch backend, the trained
weights published and exported. (`tests/test_dpo_stage.py` runs the real services.)"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import load_config
from rlfleet_trainer.run import run_stage
from rlfleet_trainer.testing import serve_servicer
from rlfleet_trainer.testing_agent import (
    DoubleEpisodes,
    ScriptedRollout,
    kv_rows,
    tool_call,
)

VALID = [tool_call("set_value", key="a", value=1), tool_call("add", key="a", amount=2), "Done."]
UNKNOWN_TOOL = [tool_call("make_it_three", key="a"), "Done."]


def _recipe(tiny_model: Path, rollout: str, reward: str, *extra: str) -> RecipeConfig:
    return load_config(
        RecipeConfig,
        overrides=[
            "stage=dpo-test",
            f"policy.model={tiny_model}",
            "policy.max_total_sequence_length=1024",
            "policy.train_micro_batch_size=2",
            "generation.max_new_tokens=100",
            "grpo.val_at_start=true",
            "grpo.val_at_end=true",
            "grpo.num_val_prompts=2",
            "grpo.val_samples_per_prompt=2",
            "multi_turn.envs=[kv]",
            "dpo.num_prompts=3",
            "dpo.samples_per_prompt=2",
            "dpo.pairs_per_step=2",
            "dpo.epochs=2",
            "dpo.lr=1e-3",
            f"services.rollout={rollout}",
            f"services.reward={reward}",
            *extra,
        ],
    )


async def test_dpo_stage_samples_pairs_trains_publishes_and_measures(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    scripted = ScriptedRollout(tokenizer, [VALID, UNKNOWN_TOOL], "<|im_end|>")
    episodes = DoubleEpisodes(tools=("set_value", "add"))  # type: ignore[abstract]
    async with serve_servicer(scripted) as rollout, serve_servicer(episodes) as reward:
        recipe = _recipe(tiny_model, rollout, reward)
        state = await run_stage(recipe, tmp_path, rows=kv_rows(4), val_rows=kv_rows(2))
    # 3 prompts x 1 pair, 2 pairs a step, 2 epochs: 2 batches x 2 = 4 steps.
    assert state.step == 4
    heldout = json.loads((tmp_path / "heldout.json").read_text())
    for when in ("before", "after"):  # the script does not learn: half of them hallucinate
        assert heldout["details"][when]["hallucination_rate"] == 0.5
        assert heldout["details"][when]["kv/hallucination_rate"] == 0.5
        assert heldout["details"][when]["valid_call_rate"] == 0.5
        assert heldout[when]["reward"] == 0.5
    samples = [
        json.loads(line) for line in (tmp_path / "heldout_before.jsonl").read_text().splitlines()
    ]
    assert sorted(s["verdict"] for s in samples) == [
        "correct",
        "correct",
        "wrong_name",
        "wrong_name",
    ]
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == 3
    for pair in pairs:
        assert "set_value" in pair["chosen"][0]["content"]
        assert "make_it_three" in pair["rejected"][0]["content"]
        assert pair["metadata"]["rejected"]["verdict"] == "wrong_name"
        assert pair["metadata"]["rejected"]["tool_calls"]["unknown_tool"] == 1
        assert pair["metadata"]["chosen"]["tool_calls"]["ok"] == 2
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert metrics[0]["sampling/pairs"] == 3 and metrics[0]["sampling/verdict/wrong_name"] == 3
    assert metrics[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)  # reference = start
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    # the trained weights went to the rollout before the held-out "after" ...
    assert scripted.updates and max(s["weight_version"] for s in samples) < scripted.updates[-1]
    after = [
        json.loads(line) for line in (tmp_path / "heldout_after.jsonl").read_text().splitlines()
    ]
    assert {s["weight_version"] for s in after} == {scripted.updates[-1]}
    # ... and to hf/, changed.
    start = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert any(not torch.equal(start[k], trained[k]) for k in start)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["step"] == 4 and summary["metrics"]["sampling/pairs"] == 3


async def test_dpo_stage_without_pairs_fails_naming_the_counts(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    scripted = ScriptedRollout(tokenizer, [UNKNOWN_TOOL], "<|im_end|>")  # never valid
    episodes = DoubleEpisodes(tools=("set_value", "add"))  # type: ignore[abstract]
    async with serve_servicer(scripted) as rollout, serve_servicer(episodes) as reward:
        recipe = _recipe(tiny_model, rollout, reward, "grpo.val_at_start=false")
        with pytest.raises(RuntimeError, match=r"dpo: no pair from 6 trajectories.*wrong_name"):
            await run_stage(recipe, tmp_path, rows=kv_rows(4), val_rows=kv_rows(2))
