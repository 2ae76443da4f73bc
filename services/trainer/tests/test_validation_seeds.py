"""Seeded held-out measures: with `generation.seed`, the start and end measures ask the
engine for the same seed per held-out sample (common random numbers: their paired
difference is the policy's, not the sampler's), clear of the training stream's seeds;
without it, nothing is seeded. Over real gRPC to the trainer's rollout double, which
records what each request asked for."""

from __future__ import annotations

from pathlib import Path

from rlfleet_trainer.run import run_stage
from rlfleet_trainer.testing import doubles_recipe, serve_doubles
from rlfleet_trainer.testing import letter_rows as rows
from rlfleet_trainer.validation import VAL_SEED_OFFSET

VAL_PROMPTS, VAL_SAMPLES, GROUP = 3, 2, 4


async def _seeds_of_a_stage(tiny_model: Path, run_dir: Path, *extra: str) -> dict[str, int | None]:
    async with serve_doubles(tiny_model) as (rollout_target, reward_target, rollout, _):
        cfg = doubles_recipe(
            tiny_model,
            rollout_target,
            reward_target,
            "generation.max_new_tokens=4",
            "grpo.num_prompts_per_step=3",
            f"grpo.num_generations_per_prompt={GROUP}",
            "grpo.max_trajectory_age_steps=0",
            "grpo.max_num_steps=1",
            "grpo.val_at_start=true",
            "grpo.val_at_end=true",
            f"grpo.num_val_prompts={VAL_PROMPTS}",
            f"grpo.val_samples_per_prompt={VAL_SAMPLES}",
            *extra,
        )
        await run_stage(cfg, run_dir, rows=rows(), val_rows=rows(VAL_PROMPTS))
        return dict(rollout.seeds)


async def test_seeded_measures_share_seeds_and_miss_the_training_ones(
    tiny_model: Path, tmp_path: Path
) -> None:
    seeds = await _seeds_of_a_stage(tiny_model, tmp_path, "generation.seed=5")
    for i in range(VAL_PROMPTS):
        expected = 5 + VAL_SEED_OFFSET + i * VAL_SAMPLES
        assert seeds[f"before-{i}"] == seeds[f"after-{i}"] == expected, seeds
    training = {k: v for k, v in seeds.items() if not k.startswith(("before-", "after-"))}
    assert len(training) == 3, seeds  # one step of three prompts
    assert {v for v in training.values()} == {5 + i * GROUP for i in range(3)}, seeds


async def test_unseeded_recipe_seeds_nothing(tiny_model: Path, tmp_path: Path) -> None:
    seeds = await _seeds_of_a_stage(tiny_model, tmp_path)
    assert seeds and set(seeds.values()) == {None}, seeds
