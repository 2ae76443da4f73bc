"""Bundled recipes load, mirror the published tables (docs/recipes.md), and `rlfleet rl
--dry-run` shows them with a launch plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_core.config import ConfigError
from rlfleet_pipeline.recipes import bundled_recipes, load_recipe

RLFLEET = str(Path(sys.executable).parent / "rlfleet")

# stage: (prompts/step, generations/prompt, max seq len, TP, CP, lr, KL, overlong, nodes, generation nodes)
PUBLISHED = {
    "super3/rlvr1": (256, 16, 65536, 4, 8, 3e-6, 0.0, False, 109, 72),
    "super3/swe1": (64, 16, 131072, 8, 8, 1e-6, 0.0, True, 64, 32),
    "super3/swe2": (16, 32, 196608, 8, 8, 1e-6, 0.0, True, 64, 32),
    "super3/rlhf": (128, 16, 49152, 4, 4, 1e-6, 1e-4, False, 72, 32),
}


@pytest.mark.parametrize("name", bundled_recipes())
def test_every_bundled_recipe_loads(name: str) -> None:
    recipe = load_recipe(name)
    assert recipe.grpo.num_generations_per_prompt >= 2


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_super3_recipes_match_the_published_tables(
    name: str, published: tuple[object, ...]
) -> None:
    r = load_recipe(name)
    got = (
        r.grpo.num_prompts_per_step,
        r.grpo.num_generations_per_prompt,
        r.policy.max_total_sequence_length,
        r.policy.tensor_parallel_size,
        r.policy.context_parallel_size,
        r.grpo.lr,
        r.grpo.kl_coef,
        r.grpo.overlong_filtering,
        r.cluster.num_nodes,
        r.cluster.generation_nodes,
    )
    assert got == published


def test_rlvr_stages_share_settings_and_chain_checkpoints() -> None:
    one, two, three = (load_recipe(f"super3/rlvr{i}") for i in (1, 2, 3))
    assert one.grpo == two.grpo == three.grpo
    assert two.policy.model == "runs/super3/rlvr1/checkpoints/final/hf"
    assert (one.data.train_path, three.data.train_path) == (
        "data/rlvr1/train/data.jsonl",
        "data/rlvr3/train/data.jsonl",
    )
    assert load_recipe("super3/rlvr1", ["grpo.lr=1e-6"]).grpo.lr == 1e-6


def test_rlvr_low_effort_schedule_is_the_published_one() -> None:
    """2% of prompts (math, STEM QA, competitive coding) early, 1% (math, STEM QA) late;
    we run the late phase in RLVR 3 (docs/recipes.md says why)."""
    phases = {
        i: [p.model_dump() for p in load_recipe(f"super3/rlvr{i}").reasoning.low_effort.phases]
        for i in (1, 2, 3)
    }
    early = {"from_step": 1, "fraction": 0.02, "envs": ["math", "mcqa", "code"]}
    late = {"from_step": 1, "fraction": 0.01, "envs": ["math", "mcqa"]}
    assert phases == {1: [early], 2: [early], 3: [late]}


def test_unknown_recipe_lists_the_bundled_ones() -> None:
    with pytest.raises(ConfigError, match=r"no bundled recipe of that name.*super3/rlvr1"):
        load_recipe("super3/nope")


def rl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RLFLEET, "rl", *args], capture_output=True, text=True, timeout=120)


def test_dry_run_prints_the_published_stage1_parameters() -> None:
    result = rl("rlvr", "-c", "super3/rlvr1", "--dry-run")
    assert result.returncode == 0, result.stderr
    for text in (
        "109 (872)",
        "72 (colocated=false)",
        "256",
        "4,096",
        "65,536",
        "4 / 1 / 8 / 1",
        "3e-06",
    ):
        assert text in result.stdout, text
    assert (
        "lr: 3.0e-06" in result.stdout
        and "-m rlfleet_trainer run -c runs/rlvr1/recipe.yaml" in result.stdout
    )


def test_dry_run_with_a_slurm_profile_prints_the_sbatch_script(tmp_path: Path) -> None:
    env_toml = tmp_path / "env.toml"
    env_toml.write_text(
        '[c]\nlauncher = "slurm"\naccount = "a"\npartition = "p"\n[c.images]\n'
        'trainer = "t.sqsh"\nrollout = "r.sqsh"\nreward = "w.sqsh"\nsandbox = "s.sqsh"\n'
    )
    result = subprocess.run(
        [RLFLEET, "rl", "rlhf", "-c", "super3/rlhf", "--run", "c", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "#SBATCH --job-name=rlfleet-rlhf" in result.stdout
        and "--container-image=t.sqsh" in result.stdout
    )


def test_stage_mismatch_and_bad_override_are_one_line_errors() -> None:
    mismatch = rl("rlvr", "-c", "super3/swe1", "--dry-run")
    assert mismatch.returncode == 2 and "is stage 'swe1', not 'rlvr'" in mismatch.stderr
    bad = rl("rlvr", "-c", "super3/rlvr1", "--dry-run", "grpo.lr=abc")
    assert bad.returncode == 2
    assert [ln for ln in bad.stderr.splitlines() if ln.strip()] == [
        "rlfleet: config error: grpo.lr: expected a number, got 'abc' (from override grpo.lr=abc)"
    ]


def test_shared_file_recipe_tells_the_rollout_to_trust_its_folder(tmp_path: Path) -> None:
    """The rollout refuses shared-file loads outside `weight_file_roots`; the stage
    passes the recipe's shared_dir so such a recipe works out of the box."""
    from rlfleet_core.config import parse_overrides
    from rlfleet_pipeline.stage import rollout_overrides

    shared = tmp_path / "weights dir"
    recipe = load_recipe(
        "test", ["services.weight_transport=shared_file", f"services.shared_dir={shared}"]
    )
    parsed = parse_overrides(rollout_overrides(recipe, "hf")["rollout"])
    assert parsed["weight_file_roots"] == [str(shared)]
    plain = parse_overrides(rollout_overrides(load_recipe("test"), "hf")["rollout"])
    assert "weight_file_roots" not in plain
