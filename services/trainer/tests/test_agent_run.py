"""A GRPO run whose environment is multi-turn: the loop trains on scripted trajectories
(tool calls through the episode double), validates them the same way, and accounts for
every prompt in the ledger."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import load_config
from rlfleet_trainer.ledger import Ledger
from rlfleet_trainer.run import run_stage
from rlfleet_trainer.testing import serve_servicer
from rlfleet_trainer.testing_agent import (
    DoubleEpisodes,
    ScriptedRollout,
    kv_rows,
    tool_call,
)

REACH = [tool_call("set_value", key="a", value=1), tool_call("add", key="a", amount=2), "Done."]
MISS = [tool_call("set_value", key="a", value=7), "Done."]


async def test_a_multi_turn_stage_trains_and_validates(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    scripted = ScriptedRollout(tokenizer, [REACH, MISS], "<|im_end|>")
    episodes = DoubleEpisodes(tools=("set_value", "add"))  # type: ignore[abstract]
    async with serve_servicer(scripted) as rollout, serve_servicer(episodes) as reward:
        cfg = load_config(
            RecipeConfig,
            overrides=[
                f"policy.model={tiny_model}",
                "policy.max_total_sequence_length=1024",
                "policy.train_micro_batch_size=4",
                "policy.logprob_micro_batch_size=4",
                "generation.max_new_tokens=100",
                "grpo.num_prompts_per_step=2",
                "grpo.num_generations_per_prompt=2",
                "grpo.max_num_steps=2",
                "grpo.max_trajectory_age_steps=0",  # sync: no groups in flight at the end
                "grpo.val_every_steps=2",
                "grpo.num_val_prompts=2",
                "grpo.val_samples_per_prompt=2",
                "multi_turn.envs=[kv]",
                f"services.rollout={rollout}",
                f"services.reward={reward}",
            ],
        )
        state = await run_stage(cfg, tmp_path, rows=kv_rows(4), val_rows=kv_rows(2))
    assert state.step == 2
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["reward/kv"] == 0.5  # sample 0 reaches the goal, sample 1 misses it
        assert math.isfinite(m["loss"])
        assert m["truncated_fraction"] == 0.0
    assert metrics[1]["val/reward"] == 0.5
    assert not episodes.episodes and not episodes.abandoned  # every episode closed, scored
    assert len(episodes.scored) == 2 * 2 * 2 + 2 * 2  # 2 steps × 2 groups × 2, validation
    trained = [e for e in Ledger(tmp_path / "ledger.jsonl").entries() if e.outcome == "trained"]
    assert len(trained) == 4
    assert scripted.updates == sorted(scripted.updates) and len(scripted.updates) >= 2
