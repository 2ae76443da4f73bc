"""`rlfleet config import nemo-rl`: NeMo-RL's GRPO example (a trimmed copy in fixtures/)
becomes a recipe that loads and passes `rlfleet rl --dry-run`, and every NeMo-RL key is
either mapped or listed back with its value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_cli.main import app
from rlfleet_cli.nemo_rl import import_grpo, read_nemo_rl
from rlfleet_pipeline.recipes import load_recipe
from typer.testing import CliRunner

FIXTURE = Path(__file__).parent / "fixtures" / "nemo_rl_grpo_math_1B.yaml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def imported(tmp_path: Path) -> tuple[Path, str]:
    out = tmp_path / "recipe.yaml"
    code, stdout, stderr = run("config", "import", "nemo-rl", str(FIXTURE), "--out", str(out))
    assert code == 0, stderr
    return out, stdout


def test_import_writes_a_recipe_with_nemo_rl_settings(imported: tuple[Path, str]) -> None:
    out, stdout = imported
    assert stdout.startswith(f"wrote {out}\n")
    recipe = load_recipe(str(out))
    g, p = recipe.grpo, recipe.policy
    assert (g.num_prompts_per_step, g.num_generations_per_prompt) == (32, 16)
    assert (g.lr, g.kl_coef, g.kl_type, g.ratio_clip_max) == (5e-6, 0.01, "k3", 0.2)
    assert (g.val_every_steps, g.num_val_prompts, g.loss_level) == (10, 256, "token")
    # async_grpo.enabled: false -> synchronous; no IS correction asked for.
    assert (g.max_trajectory_age_steps, g.importance_sampling) == (0, "none")
    assert (p.model, p.dtype, p.max_total_sequence_length) == ("Qwen/Qwen2.5-1.5B", "bfloat16", 512)
    assert (p.logprob_micro_batch_size, p.optimizer.eps) == (4, 1e-8)  # via ${...}
    assert (recipe.generation.logprobs_mode, recipe.generation.top_k) == ("processed", 0)
    assert (recipe.checkpoint.dir, recipe.checkpoint.save_every_steps) == ("results/grpo", 10)
    # NeMo-RL's max_new_tokens fills the context; rlfleet's must leave room for the prompt.
    assert recipe.generation.max_new_tokens == 256
    assert "generation.max_new_tokens" in recipe.deviations
    assert "adjusted generation.max_new_tokens: NeMo-RL policy.generation.max_new_tokens=512" in (
        stdout
    )


def test_every_key_is_mapped_or_listed_with_its_value(imported: tuple[Path, str]) -> None:
    _, stdout = imported
    result = import_grpo(read_nemo_rl(FIXTURE))
    leaves = set(_leaf_keys(read_nemo_rl(FIXTURE)))
    assert leaves == result.mapped | set(result.unmapped)
    assert not result.mapped & set(result.unmapped)
    listed = {
        line.strip().partition(": ")[0]: line.strip().partition(": ")[2]
        for line in stdout.splitlines()
        if line.startswith("  ")
    }
    assert listed.keys() == result.unmapped.keys()
    assert f"not mapped ({len(listed)} keys):" in stdout
    for key, shown in {
        "grpo.max_num_epochs": "1",
        "logger.wandb.project": "grpo-dev",
        "policy.dtensor_cfg.cpu_offload": "false",
        "data.train.dataset_name": "OpenMathInstruct-2",
        "env.math.num_workers": "8",
        "policy.megatron_cfg.tensor_model_parallel_size": "1",
        "policy.tokenizer.name": "Qwen/Qwen2.5-1.5B",  # ${policy.model_name}, resolved
        "policy.sequence_packing.train_mb_tokens": (
            "'${mul:${policy.max_total_sequence_length}, ${policy.train_micro_batch_size}}'"
        ),
        "policy.optimizer.kwargs.betas": None,  # mapped: not listed
    }.items():
        assert listed.get(key) == shown, key
    for mapped in (
        "grpo.num_prompts_per_step",
        "policy.optimizer.kwargs.lr",
        "loss_fn.ratio_clip_min",
    ):
        assert mapped in result.mapped


def _leaf_keys(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, value in node.items() for k in _leaf_keys(value, f"{prefix}{key}.")]
    return [prefix[:-1]]


def test_imported_recipe_passes_rl_dry_run(imported: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = imported
    rows = tmp_path / "rows.jsonl"
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": "1+1? Answer only."}]},
        "agent_ref": {"name": "math"},
        "expected_answer": "2",
    }
    rows.write_text(json.dumps(row) + "\n")
    # A model this machine has, and rows: NeMo-RL names a Hub model and a dataset.
    code, stdout, stderr = run(
        "rl", "rlvr", "-c", str(out), "--dry-run", "--engine", "hf", "--out",
        str(tmp_path / "run"), "policy.model=tiny", f"data.train_path={rows}",
    )  # fmt: skip
    assert code == 0, stderr + stdout
    assert "# resolved recipe" in stdout


def test_a_value_rlfleet_refuses_names_the_key_and_its_nemo_rl_source(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"defaults: {FIXTURE}\ngrpo:\n  num_generations_per_prompt: 1\n")
    code, _, stderr = run("config", "import", "nemo-rl", str(bad), "--out", str(tmp_path / "r"))
    assert code == 2
    assert stderr.strip().splitlines() == [
        "rlfleet: config error: grpo.num_generations_per_prompt: input should be greater "
        "than or equal to 2, got 1 (from NeMo-RL grpo.num_generations_per_prompt)"
    ]
    assert not (tmp_path / "r").exists()


def test_defaults_chain_and_references(tmp_path: Path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text(
        f"defaults: {FIXTURE}\npolicy:\n  model_name: tiny\n"
        "grpo:\n  async_grpo:\n    enabled: true\n    max_trajectory_age_steps: 2\n"
        "loss_fn:\n  use_importance_sampling_correction: true\n"
        "  truncated_importance_sampling_type: icepop\n"
    )
    result = import_grpo(read_nemo_rl(child))
    assert result.recipe["policy"]["model"] == "tiny"
    assert result.unmapped["policy.tokenizer.name"] == "tiny"
    assert result.recipe["grpo"]["max_trajectory_age_steps"] == 2
    assert result.recipe["grpo"]["importance_sampling"] == "icepop"


def test_megatron_backend_and_its_parallelism(tmp_path: Path) -> None:
    child = tmp_path / "megatron.yaml"
    child.write_text(
        f"defaults: {FIXTURE}\npolicy:\n  megatron_cfg:\n    enabled: true\n"
        "    tensor_model_parallel_size: 2\n    pipeline_model_parallel_size: 2\n"
        "    optimizer:\n      lr: 3.0e-6\n      adam_beta1: 0.9\n      adam_beta2: 0.98\n"
    )
    result = import_grpo(read_nemo_rl(child))
    policy = result.recipe["policy"]
    assert (policy["backend"], policy["tensor_parallel_size"]) == ("megatron", 2)
    assert policy["pipeline_parallel_size"] == 2
    assert policy["optimizer"]["betas"] == [0.9, 0.98]
    assert result.recipe["grpo"]["lr"] == 3e-6
    assert "policy.megatron_cfg.tensor_model_parallel_size" in result.mapped
    # DTensor's settings are not what trains now: listed, not mapped.
    assert result.unmapped["policy.dtensor_cfg.tensor_parallel_size"] == 1


def test_unknown_source_and_missing_file_are_one_line(tmp_path: Path) -> None:
    code, _, stderr = run("config", "import", "verl", str(FIXTURE))
    assert code == 2
    assert "config import 'verl': expected one of nemo-rl" in stderr
    code, _, stderr = run("config", "import", "nemo-rl", str(tmp_path / "none.yaml"))
    assert code == 2
    assert stderr.strip().splitlines() == [
        f"rlfleet: config error: {tmp_path / 'none.yaml'}: config file not found"
    ]


def test_help_shows_the_grammar_and_the_out_default() -> None:
    env = {"COLUMNS": "400", "TERMINAL_WIDTH": "400"}
    help_rl = CliRunner().invoke(app, ["rl", "--help"], env=env).stdout
    for text in ("+key=value (add a new key)", "++key=value", "~key=value", "[a,b]", "{a:1}"):
        assert text in help_rl, text
    help_import = CliRunner().invoke(app, ["config", "import", "--help"], env=env).stdout
    assert "(default: FILE with the suffix .rlfleet.yaml)" in help_import
