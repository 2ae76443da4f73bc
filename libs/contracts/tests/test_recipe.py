"""The recipe schema: defaults, documentation and cross-field rules with fixes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import ConfigError, load_config


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(RecipeConfig, overrides=list(overrides))
    return "\n".join(info.value.lines)


def test_defaults_match_nemo_rl() -> None:
    recipe = RecipeConfig()
    assert recipe.grpo.ratio_clip_min == 0.2
    assert recipe.grpo.ratio_clip_max == 0.28
    assert recipe.grpo.max_trajectory_age_steps == 1
    assert recipe.grpo.async_enabled
    assert recipe.grpo.importance_sampling == "tis"
    assert recipe.grpo.importance_weight_max == 5.0
    assert recipe.grpo.loss_level == "token"
    assert recipe.global_batch_size == 8 * 4


def test_every_field_is_documented() -> None:
    def walk(model: type, prefix: str) -> list[str]:
        missing = []
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            annotation = info.annotation
            if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
                missing += walk(annotation, f"{prefix}{name}.")
            elif (
                name
                not in {
                    "tensor_parallel_size",
                    "pipeline_parallel_size",
                    "context_parallel_size",
                    "expert_parallel_size",
                    "weight_decay",
                    "betas",
                    "eps",
                }
                and not info.description
            ):
                missing.append(prefix + name)
        return missing

    assert walk(RecipeConfig, "") == []


def test_gspo_needs_sequence_level_loss() -> None:
    line = _error("grpo.sequence_level_importance_ratios=true")
    assert "grpo.loss_level=sequence" in line
    ok = load_config(
        RecipeConfig,
        overrides=["grpo.sequence_level_importance_ratios=true", "grpo.loss_level=sequence"],
    )
    assert ok.grpo.sequence_level_importance_ratios


def test_async_needs_importance_sampling() -> None:
    line = _error("grpo.importance_sampling=none")
    assert "grpo.max_trajectory_age_steps (1)" in line and "grpo.importance_sampling=tis" in line
    sync = load_config(
        RecipeConfig, overrides=["grpo.importance_sampling=none", "grpo.max_trajectory_age_steps=0"]
    )
    assert not sync.grpo.async_enabled


def test_importance_bounds_ordered() -> None:
    line = _error("grpo.importance_weight_min=3", "grpo.importance_weight_max=2")
    assert "grpo.importance_weight_min (3.0)" in line


def test_dual_clip_must_exceed_one() -> None:
    assert "grpo.ratio_clip_c" in _error("grpo.ratio_clip_c=0.5")


def test_model_parallel_needs_megatron() -> None:
    assert "policy.backend=megatron" in _error("policy.tensor_parallel_size=2")
    ok = load_config(
        RecipeConfig, overrides=["policy.tensor_parallel_size=2", "policy.backend=megatron"]
    )
    assert ok.policy.tensor_parallel_size == 2


def test_micro_batch_within_global_batch() -> None:
    line = _error("policy.train_micro_batch_size=64")
    assert "policy.train_micro_batch_size (64)" in line and "(32)" in line


def test_shared_file_needs_dir() -> None:
    assert "services.shared_dir" in _error("services.weight_transport=shared_file")


def test_unknown_choice_names_valid_ones() -> None:
    assert "tis" in _error("grpo.importance_sampling=bogus")


def test_failure_budget_replaces_the_per_run_count() -> None:
    message = _error("grpo.max_generation_failures=8")
    assert "grpo.max_failed_group_fraction" in message
    assert "grpo.max_consecutive_failing_steps" in message
    assert "max_failed_group_fraction" in _error("grpo.max_failed_group_fraction=1")
    assert "call_attempts" in _error("services.call_attempts=0")


def test_policy_model_takes_bundled_names_paths_and_hub_ids() -> None:
    for model in ("tiny", "/runs/a/stages/rlvr1/hf", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        recipe = load_config(RecipeConfig, overrides=[f"policy.model={model}"])
        assert recipe.policy.model == model
    (line,) = _error("policy.model=not a model").splitlines()
    assert line.startswith("policy.model: 'not a model' is not a bundled name")
    assert "Hugging Face id" in line


@pytest.mark.parametrize(
    ("stage", "kind"),
    [("rlvr2", "rlvr"), ("rlvr-tooluse", "rlvr"), ("swe1", "swe"), ("rlhf", "rlhf"),
     ("dpo-tooluse", "dpo"), ("grpo", "grpo")],
)  # fmt: skip
def test_the_stage_kind_is_read_from_the_stage_name(stage, kind):
    assert RecipeConfig.model_validate({"stage": stage}).kind == kind


def test_a_stage_name_of_no_kind_needs_kind_set():
    with pytest.raises(ValidationError, match=r"stage 'warmup' does not start with a stage kind"):
        RecipeConfig.model_validate({"stage": "warmup"})
    assert RecipeConfig.model_validate({"stage": "warmup", "kind": "swe"}).kind == "swe"
    with pytest.raises(ValidationError, match="kind"):
        RecipeConfig.model_validate({"stage": "rlvr1", "kind": "sft"})
