"""The GRPO loop over real gRPC (test doubles of rollout and reward, see
rlfleet_trainer.testing): sync and async runs, the ledger, policy lag, weight publishing,
drops with reasons, and exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_trainer.checkpoint import list_checkpoints
from rlfleet_trainer.context import build_context
from rlfleet_trainer.ledger import Ledger, verify_ledger
from rlfleet_trainer.run import run_stage
from rlfleet_trainer.testing import doubles_recipe, serve_doubles
from rlfleet_trainer.testing import letter_rows as rows


def recipe(model: Path, rollout: str, reward: str, *overrides: str) -> RecipeConfig:
    return doubles_recipe(
        model,
        rollout,
        reward,
        "policy.train_micro_batch_size=8",
        "policy.logprob_micro_batch_size=16",
        "generation.max_new_tokens=12",
        "grpo.num_prompts_per_step=3",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=3",
        "grpo.lr=1e-3",
        "checkpoint.save_every_steps=1",
        *overrides,
    )


def issued(run_dir: Path) -> list[str]:
    """Prompt ids the run issued, re-derived from the data order and final cursor."""
    return json.loads((run_dir / "issued.json").read_text())


@pytest.mark.parametrize("age", [0, 1])
async def test_sync_and_async_runs_account_for_every_prompt(
    tiny_model: Path, tmp_path: Path, age: int
) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, _):
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            f"grpo.max_trajectory_age_steps={age}",
            "grpo.val_every_steps=3",
            "grpo.num_val_prompts=3",
        )
        ctx_state = await run_stage(cfg, tmp_path, rows=rows(), val_rows=rows(5))
    assert ctx_state.step == 3
    # one published version per step, in order
    assert rollout.updates == [1, 2, 3]
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["policy_lag/max"] <= age
        for key in (
            "loss",
            "reward/mean",
            "reward/letters",
            "clip_fraction/low",
            "token_mult_prob_error",
            "is_oob_ratio",
            "entropy",
            "grad_norm",
            "timing/train_s",
            "throughput/train_tokens_per_s",
            "advantages/std",
        ):
            assert key in m, key
        assert m["token_mult_prob_error"] >= 1.0
    # greedy held-out reward at step 3 only
    assert "val/reward" not in metrics[0] and 0.0 <= metrics[2]["val/reward"] <= 1.0
    if age == 0:
        # on-policy: sampler and trainer hold the same float32 weights, logprobs agree
        assert all(m["policy_lag/max"] == 0 for m in metrics)
        assert all(m["token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3) for m in metrics)
    else:
        # async: later steps train on samples generated one version back
        assert max(m["policy_lag/max"] for m in metrics) == 1
    entries = Ledger(tmp_path / "ledger.jsonl").entries()
    cursor = json.loads((tmp_path / "checkpoints" / "step_3" / "trainer_state.json").read_text())[
        "data_cursor"
    ]
    ctx = build_context(cfg, tmp_path / "probe", rows=rows())
    ctx.source.cursor = cursor
    counts = verify_ledger(entries, ctx.source.issued_ids())
    assert counts["trained"] == 9
    assert sum(v for k, v in counts.items() if k.startswith("dropped/")) == len(entries) - 9
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert len(list_checkpoints(tmp_path / "checkpoints")) == 2  # keep_last


async def test_failed_rewards_are_dropped_with_reason(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
        reward.fail_prompt_ids = {"r0@0", "r5@0", "r7@0"}
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_trajectory_age_steps=0",
            "data.shuffle=false",
            "grpo.max_num_steps=2",
        )
        await run_stage(cfg, tmp_path, rows=rows())
    entries = Ledger(tmp_path / "ledger.jsonl").entries()
    failed = {e.prompt_id for e in entries if e.reason == "reward_failed"}
    assert failed == {"r0@0", "r5@0", "r7@0"}


async def test_too_many_failures_stop_the_run(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
        reward.fail_prompt_ids = {f"r{i}@0" for i in range(12)}
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_trajectory_age_steps=0",
            "grpo.max_failed_group_fraction=0",
            "grpo.max_consecutive_failing_steps=0",
        )
        with pytest.raises(Exception, match="max_consecutive_failing_steps"):
            await run_stage(cfg, tmp_path, rows=rows())


async def test_dynamic_sampling_drops_zero_variance_groups(
    tiny_model: Path, tmp_path: Path
) -> None:
    # target_chars "" -> every reward is 0 -> every group has zero variance.
    data = [dict(r, target_chars="") for r in rows()]
    data[3]["target_chars"] = "etaoin "
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, _):
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_trajectory_age_steps=0",
            "grpo.dynamic_sampling=true",
            "grpo.max_num_steps=1",
            "grpo.num_prompts_per_step=1",
            "data.shuffle=false",
            "policy.train_micro_batch_size=4",
        )
        await run_stage(cfg, tmp_path, rows=data)
    entries = Ledger(tmp_path / "ledger.jsonl").entries()
    assert [e.prompt_id for e in entries if e.outcome == "trained"] == ["r3@0"]
    assert {e.prompt_id for e in entries if e.reason == "zero_variance"} == {"r0@0", "r1@0", "r2@0"}


async def test_resume_continues_from_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, _):
        cfg = recipe(tiny_model, rollout_target, reward_target, "grpo.max_num_steps=2")
        await run_stage(cfg, tmp_path, rows=rows())
        longer = cfg.model_copy(update={"grpo": cfg.grpo.model_copy(update={"max_num_steps": 4})})
        state = await run_stage(longer, tmp_path, rows=rows(), resume=True)
    assert state.step == 4
    # the restored weights were re-published under a newer version, then one per step
    assert rollout.updates == [1, 2, 3, 4, 5]
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    entries = Ledger(tmp_path / "ledger.jsonl").entries()
    ctx = build_context(longer, tmp_path / "probe", rows=rows())
    ctx.source.cursor = state.data_cursor
    assert verify_ledger(entries, ctx.source.issued_ids())["trained"] == 12


async def test_prompts_that_never_fit_fail_loudly(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, _):
        cfg = recipe(tiny_model, rollout_target, reward_target, "data.max_prompt_tokens=2")
        with pytest.raises(ValueError, match="longer than 2 tokens"):
            await run_stage(cfg, tmp_path, rows=rows())


async def test_async_without_in_flight_updates_drains_before_publishing(
    tiny_model: Path, tmp_path: Path
) -> None:
    from rlfleet_proto.v1 import rollout_pb2

    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, _):
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.in_flight_weight_updates=false",
            "grpo.max_num_steps=2",
        )
        await run_stage(cfg, tmp_path, rows=rows())
    assert rollout.pauses == [rollout_pb2.PAUSE_MODE_WAIT] * 2 and rollout.resumes == 2
    assert rollout.updates == [1, 2]
