"""Failure handling over real gRPC (the doubles of rlfleet_trainer.testing, told to fail):
transient failures are retried, a group that still fails is dropped and counted, the
budget is per step with a streak of failing steps, and validation scores over what did
not fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_proto.v1 import reward_pb2
from rlfleet_trainer.collector import FailureBudget
from rlfleet_trainer.ledger import Ledger
from rlfleet_trainer.run import run_stage
from rlfleet_trainer.testing import doubles_recipe, serve_doubles
from rlfleet_trainer.testing import letter_rows as rows

TIMEOUT = reward_pb2.FAILURE_KIND_TIMEOUT
SANDBOX = reward_pb2.FAILURE_KIND_SANDBOX_ERROR
OVERLOADED = reward_pb2.FAILURE_KIND_OVERLOADED
VERIFIER = reward_pb2.FAILURE_KIND_VERIFIER_ERROR


def recipe(model: Path, rollout: str, reward: str, *overrides: str) -> RecipeConfig:
    """Synchronous, unshuffled: which prompt is issued when is known."""
    return doubles_recipe(
        model,
        rollout,
        reward,
        "policy.train_micro_batch_size=12",
        "policy.logprob_micro_batch_size=12",
        "generation.max_new_tokens=8",
        "grpo.num_prompts_per_step=3",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_trajectory_age_steps=0",
        "data.shuffle=false",
        *overrides,
    )


def step_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def drops(run_dir: Path, reason: str) -> set[str]:
    return {e.prompt_id for e in Ledger(run_dir / "ledger.jsonl").entries() if e.reason == reason}


async def test_transient_failures_are_retried_and_counted(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, reward):
        # Four UNAVAILABLE outlast the channel's own gRPC retries: the client retries.
        rollout.faults = {
            "r0@0": [grpc.StatusCode.UNAVAILABLE] * 4 + [grpc.StatusCode.DEADLINE_EXCEEDED],
            "r1@0": [grpc.StatusCode.RESOURCE_EXHAUSTED],
        }
        # after the first sample: past what the channel's own retry can redo
        rollout.midstream_faults = {"r5@0": [grpc.StatusCode.UNAVAILABLE]}
        reward.faults = {
            # a shed call, then two samples failing transiently: the third try completes it
            "r2@0": [grpc.StatusCode.RESOURCE_EXHAUSTED, {0: SANDBOX, 3: OVERLOADED}],
            # a permanent failure of one sample: not retried, the group is dropped
            "r4@0": [{1: VERIFIER}],
        }
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_num_steps=2",
            "services.retry_backoff_s=0.01",
        )
        await run_stage(cfg, tmp_path, rows=rows())
    assert reward.calls_by_id["r2@0"] == 3
    assert reward.calls_by_id["r4@0"] == 1
    assert {"r1@0/retry1", "r5@0/retry1"} <= set(rollout.request_ids)
    assert drops(tmp_path, "generation_failed") == set()
    assert drops(tmp_path, "reward_failed") == {"r4@0"}
    trained = [
        e.prompt_id for e in Ledger(tmp_path / "ledger.jsonl").entries() if e.outcome == "trained"
    ]
    assert {"r0@0", "r1@0", "r2@0"} <= set(trained) and len(trained) == 6
    metrics = step_metrics(tmp_path)
    assert sum(m["failures/retries"] for m in metrics) == 6  # r0: 2, r1: 1, r2: 2, r5: 1
    assert [m["failures/groups"] for m in metrics] == [0, 1]
    assert [m["failures/samples"] for m in metrics] == [0, 1]
    assert [m["failures/failing_steps"] for m in metrics] == [0, 0]


async def test_failure_budget_is_per_step_not_per_run(tiny_model: Path, tmp_path: Path) -> None:
    # Every even prompt fails: each step loses 3 groups (r0, r2, r4 while r1, r3, r5 are
    # collected), within the default budget of a step (0.5 -> 3 of 3), 12 in the run.
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
        reward.fail_prompt_ids = {f"r{i}@0" for i in range(0, 24, 2)}
        cfg = recipe(tiny_model, rollout_target, reward_target, "grpo.max_num_steps=4")
        state = await run_stage(cfg, tmp_path, rows=rows(24))
    assert state.step == 4
    assert drops(tmp_path, "reward_failed") == reward.fail_prompt_ids
    metrics = step_metrics(tmp_path)
    assert [m["failures/groups"] for m in metrics] == [3, 3, 3, 3]
    assert [m["failures/samples"] for m in metrics] == [12, 12, 12, 12]
    assert [m["failures/failing_steps"] for m in metrics] == [0, 0, 0, 0]
    assert metrics[-1]["dropped/reward_failed"] == 12


@pytest.mark.parametrize("age", [0, 1])
async def test_failing_steps_stop_the_run_naming_the_settings(
    tiny_model: Path, tmp_path: Path, age: int
) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
        reward.fail_prompt_ids = {f"r{i}@{epoch}" for i in range(12) for epoch in range(4)}
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_num_steps=2",
            f"grpo.max_trajectory_age_steps={age}",
        )
        with pytest.raises(Exception, match="max_consecutive_failing_steps") as info:
            await run_stage(cfg, tmp_path, rows=rows())
    message = str(info.value)
    assert "3 failing steps in a row" in message
    assert "grpo.max_failed_group_fraction=0.5" in message and "more than 3 failed" in message
    # 3 failing steps of 4 failed groups each: the run stopped at the 12th failure
    # (calls already in flight then, 3 sync or 6 async, may still have been answered)
    assert 12 <= reward.calls <= 12 + (5 if age else 2)


def test_budget_counts_per_step_and_a_step_within_budget_ends_the_streak() -> None:
    assert FailureBudget(0.5, 2, 3).groups_per_step == 3
    assert FailureBudget(0.25, 2, 8).groups_per_step == 2
    assert FailureBudget(0.0, 2, 8).groups_per_step == 0
    budget = FailureBudget(0.5, 1, 2)  # 2 failed groups per step, 1 failing step in a row
    error = ValueError("boom")
    assert [budget.count_failure(error) for _ in range(3)] == [None, None, None]
    assert budget.failing_steps == 1  # the third failure used the step's budget up
    budget.end_step()
    assert budget.failing_steps == 1  # that step failed: the streak goes on
    assert [budget.count_failure(error) for _ in range(2)] == [None, None]
    budget.end_step()
    assert budget.failing_steps == 0  # collected within its budget: the streak ends
    for _ in range(6):  # the 3rd and the 6th use a step's budget up
        last = budget.count_failure(error)
    assert last is not None and "2 failing steps in a row" in str(last)


async def test_validation_scores_over_reward_failures(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
        reward.fail_prompt_ids = {"before-1"}  # every sample of held-out prompt 1
        reward.faults = {
            "before-0": [{0: TIMEOUT}],  # transient: retried, scored
            "val-2": [{0: VERIFIER}],  # one sample of two: left out of the mean
        }
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_num_steps=1",
            "grpo.val_at_start=true",
            "grpo.val_every_steps=1",
            "grpo.num_val_prompts=4",
            "grpo.val_samples_per_prompt=2",
            "services.retry_backoff_s=0.01",
        )
        await run_stage(cfg, tmp_path, rows=rows(), val_rows=rows(4))
    heldout = json.loads((tmp_path / "heldout.json").read_text())
    assert 0.0 <= heldout["before"]["reward"] <= 1.0
    assert set(heldout["before"]) == {"reward", "reward/letters"}
    assert heldout["failures"]["before"] == {"failed_prompts": 1, "failed_samples": 2}
    lines = [
        json.loads(line) for line in (tmp_path / "heldout_before.jsonl").read_text().splitlines()
    ]
    failed = [line for line in lines if line["reward"] is None]
    assert [line["prompt"] for line in failed] == [1, 1] and "VERIFIER_ERROR" in failed[0][
        "failure"
    ]
    (metrics,) = step_metrics(tmp_path)
    assert metrics["val/failed_prompts"] == 0 and metrics["val/failed_samples"] == 1
    assert 0.0 <= metrics["val/reward"] <= 1.0


async def test_validation_over_budget_names_the_setting(tiny_model: Path, tmp_path: Path) -> None:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, _, reward):
        reward.fail_prompt_ids = {"before-0", "before-2"}
        cfg = recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "grpo.max_num_steps=1",
            "grpo.val_at_start=true",
            "grpo.num_val_prompts=3",
        )
        with pytest.raises(Exception, match="max_failed_group_fraction") as info:
            await run_stage(cfg, tmp_path, rows=rows(), val_rows=rows(3))
    assert "2 of 3 held-out prompts failed" in str(info.value)


def test_failures_of_empty_steps_are_logged_with_the_next_step() -> None:
    """A step that trains nothing logs no metrics row; its failure counts must not vanish."""
    from rlfleet_trainer.loop import carry_failures

    empty = carry_failures({}, {"failures/groups": 2.0, "failures/failing_steps": 1.0})
    logged = carry_failures(empty, {"failures/groups": 1.0, "failures/failing_steps": 0.0})
    assert logged == {"failures/groups": 3.0, "failures/failing_steps": 0.0}
