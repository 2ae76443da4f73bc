"""Bundled recipes load, mirror the published tables (docs/recipes.md), and `rlfleet rl
--dry-run` shows them with a launch plan."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_contracts.startup import start_problem
from rlfleet_core.config import ConfigError
from rlfleet_pipeline.recipes import bundled_recipes, load_recipe
from rlfleet_pipeline.stage import default_run_dir

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


def published_value(recipe: RecipeConfig, key: str, value: int) -> int:
    """The published value of `key`: the recipe's own, or the one its `deviations` entry
    states ("published N; ..."), where the recipe runs with another here."""
    why = recipe.deviations.get(key)
    return value if why is None else int(why.removeprefix("published ").split(";")[0])


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_super3_recipes_match_the_published_tables(
    name: str, published: tuple[object, ...]
) -> None:
    r = load_recipe(name)
    cp = r.policy.context_parallel_size
    got = (
        r.grpo.num_prompts_per_step,
        r.grpo.num_generations_per_prompt,
        r.policy.max_total_sequence_length,
        r.policy.tensor_parallel_size,
        published_value(r, "policy.context_parallel_size", cp),
        r.grpo.lr,
        r.grpo.kl_coef,
        r.grpo.overlong_filtering,
        r.cluster.num_nodes,
        r.cluster.generation_nodes,
    )
    assert got == published


@pytest.mark.parametrize("name", [n for n in bundled_recipes() if n.startswith("super3/")])
def test_super3_recipes_run_without_context_parallelism_and_say_why(name: str) -> None:
    """The megatron backend refuses CP > 1 (no Transformer Engine attention), so every
    super3 recipe runs at CP 1 and records the published value and the reason."""
    r = load_recipe(name)
    assert r.policy.context_parallel_size == 1
    assert "Transformer Engine" in r.deviations["policy.context_parallel_size"]
    assert start_problem(r) is None or "context_parallel" not in str(start_problem(r))


# The published order of the Super stages; each starts from the one before.
SUPER3_CHAIN = ["rlvr1", "rlvr2", "rlvr3", "swe1", "swe2", "rlhf"]


@pytest.mark.parametrize(("prev", "name"), list(itertools.pairwise(SUPER3_CHAIN)))
def test_super3_stages_start_from_the_previous_stages_real_export(prev: str, name: str) -> None:
    """`rlfleet rl` runs a stage in runs/<stage> (default_run_dir) and the trainer exports
    to <run dir>/hf (StageFolder.hf): the next recipe's policy.model is exactly that."""
    previous, recipe = load_recipe(f"super3/{prev}"), load_recipe(f"super3/{name}")
    assert recipe.policy.model == str(StageFolder(default_run_dir(previous)).hf)
    assert recipe.policy.model == f"runs/{prev}/hf"


def test_rlvr_stages_share_settings_and_chain_checkpoints() -> None:
    one, two, three = (load_recipe(f"super3/rlvr{i}") for i in (1, 2, 3))
    assert one.grpo == two.grpo == three.grpo
    assert two.policy.model == "runs/rlvr1/hf"
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
    """The plan is printed; the dry-run then fails as the start would: the SFT checkpoint
    the recipe starts from is not on this machine."""
    result = rl("rlvr", "-c", "super3/rlvr1", "--dry-run")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "rlfleet: policy.model=./checkpoints/super3-sft: no such folder"
    )
    for text in (
        "109 (872)",
        "72 (colocated=false)",
        "256",
        "4,096",
        "65,536",
        "4 / 1 / 1 / 1",
        "differs: policy.context_parallel_size",
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
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert (
        "#SBATCH --job-name=rlfleet-rlhf" in result.stdout
        and "--container-image=t.sqsh" in result.stdout
    )


def test_stage_mismatch_and_bad_override_are_one_line_errors() -> None:
    mismatch = rl("rlvr", "-c", "super3/swe1", "--dry-run")
    assert mismatch.returncode == 2 and "is stage 'swe1' (kind swe), not 'rlvr'" in mismatch.stderr
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


def test_the_rollout_serves_the_recipes_sequence_length() -> None:
    """The rollout's own default (1,024 tokens) would refuse a longer recipe's prompts as
    too long, or serve a short one a larger KV budget than it trains."""
    from rlfleet_core.config import parse_overrides
    from rlfleet_pipeline.stage import rollout_overrides

    for name, length in (("test", 1024), ("tiny/swe2", 2048), ("super3/swe2", 196608)):
        parsed = parse_overrides(rollout_overrides(load_recipe(name), "vllm")["rollout"])
        assert parsed["engine_config"]["max_model_len"] == length, name
    longer = load_recipe("test", ["policy.max_total_sequence_length=4096"])
    parsed = parse_overrides(rollout_overrides(longer, "hf")["rollout"])
    assert parsed["engine_config"]["max_model_len"] == 4096


def test_dpo_stage_plan_and_start_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlfleet rl dpo -c tiny/dpo --dry-run`: reward + rollout (no sandbox), the trainer;
    the start checks refuse a dpo stage that has no multi-turn env or several ranks."""
    blend = tmp_path / "data/tiny-tooluse"
    for split in ("train", "val"):
        (blend / split).mkdir(parents=True)
        (blend / split / "data.jsonl").write_text('{"x": 1}\n')
    result = subprocess.run(
        [RLFLEET, "rl", "dpo", "-c", "tiny/dpo", "--dry-run", "--engine", "hf"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = result.stdout.split("# launch plan")[1]
    assert "# local: reward, rollout as processes" in plan and "sandbox" not in plan
    assert "-m rlfleet_trainer run -c runs/dpo-tooluse/recipe.yaml" in plan
    assert "samples_per_prompt: 6" in result.stdout
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe("tiny/dpo")
    assert start_problem(recipe.model_copy(update={"multi_turn": RecipeConfig().multi_turn})) == (
        "stage dpo-tooluse: a dpo stage samples multi-turn tool-use trajectories; set "
        "multi_turn.envs (e.g. [tool_use])"
    )
    two = load_recipe("tiny/dpo", ["policy.data_parallel_size=2"])
    assert "policy.world_size is 2; a dpo stage trains in one process" in str(start_problem(two))
