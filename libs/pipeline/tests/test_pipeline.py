"""`rlfleet run`'s pipeline logic without services: the run folder contract (--resume),
stage wiring (data, starting weights), results read back from stage folders, and the
bundled tiny blends and recipes it runs on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_dataprep.prep import PrepOptions, prepare_rl
from rlfleet_pipeline.pipeline import (
    PipelineError,
    RunSpec,
    prepare_data,
    stage_done,
    stage_recipe,
    stage_result,
    start_run,
)
from rlfleet_pipeline.pipelines import TINY, TINY_RLVR


def test_new_run_writes_its_spec_and_refuses_to_overwrite(tmp_path: Path) -> None:
    spec = RunSpec(engine="hf", overrides=["grpo.lr=1e-5"])
    assert start_run(tmp_path / "run", spec, resume=False) == (spec, TINY)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["engine"] == "hf"
    with pytest.raises(PipelineError, match=r"already holds a run; continue it with .*--resume"):
        start_run(tmp_path / "run", spec, resume=False)


def test_resume_repeats_the_stored_spec(tmp_path: Path) -> None:
    start_run(tmp_path, RunSpec(engine="hf", overrides=["grpo.lr=1e-5"]), resume=False)
    spec, pipeline = start_run(tmp_path, RunSpec(), resume=True)
    assert spec == RunSpec(engine="hf", overrides=["grpo.lr=1e-5"]) and pipeline == TINY
    with pytest.raises(PipelineError, match="continues the run as it was started"):
        start_run(tmp_path, RunSpec(overrides=["grpo.lr=1"]), resume=True)


def test_resume_without_a_run_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match=r"holds no run .* start one with `rlfleet run"):
        start_run(tmp_path / "empty", RunSpec(), resume=True)


def test_bad_override_fails_before_anything_is_written(tmp_path: Path) -> None:
    from rlfleet_core.config import ConfigError

    with pytest.raises(ConfigError, match=r"grpo\.lr: expected a number"):
        start_run(tmp_path / "run", RunSpec(overrides=["grpo.lr=abc"]), resume=False)
    assert not (tmp_path / "run").exists()


def test_model_replaces_the_pipeline_model(tmp_path: Path) -> None:
    _, pipeline = start_run(tmp_path, RunSpec(model="tiny"), resume=False)
    assert pipeline.model == "tiny" and pipeline.stages == TINY.stages


def test_unknown_pipeline(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="pipeline 'huge': known: tiny"):
        start_run(tmp_path, RunSpec(pipeline="huge"), resume=False)


def test_stages_chain_their_weights_and_data(tmp_path: Path) -> None:
    data = {s.name: tmp_path / "data" / s.blend for s in TINY.stages}
    first = stage_recipe(TINY, 0, tmp_path, data["rlvr1"], ["grpo.max_num_steps=2"])
    second = stage_recipe(TINY, 1, tmp_path, data["rlvr2"], [])
    assert first.stage == "rlvr1" and second.stage == "rlvr2"
    assert first.policy.model == "smollm2-135m-instruct"
    assert second.policy.model == str(tmp_path / "stages" / "rlvr1" / "hf")
    assert first.data.train_path == str(data["rlvr1"] / "train" / "data.jsonl")
    assert second.data.val_path == str(data["rlvr2"] / "val" / "data.jsonl")
    # The override reached only the recipe it was given to.
    default = stage_recipe(TINY, 0, tmp_path, data["rlvr1"], []).grpo.max_num_steps
    assert first.grpo.max_num_steps == 2 and second.grpo.max_num_steps == default != 2
    assert first.grpo.val_at_start and first.grpo.val_at_end and first.checkpoint.export_hf


def test_tiny_blends_prepare_with_held_out_rows(tmp_path: Path) -> None:
    prepared = prepare_data(TINY, tmp_path)
    held_out = {"swe1": 15, "swe2": 1, "rlhf": 16}  # one instance's turns; 1 of 4; 16 of 128
    for stage in TINY.stages[3:]:
        manifest = json.loads((prepared[stage.name] / "manifest.json").read_text())
        assert manifest["splits"]["val"]["rows"] == held_out[stage.name], stage.name
    for stage in TINY_RLVR.stages:
        manifest = json.loads((prepared[stage.name] / "manifest.json").read_text())
        assert manifest["splits"]["val"]["rows"] == 100
        assert manifest["splits"]["train"]["rows"] == 200
    rows = [json.loads(line) for line in (prepared["rlvr1"] / "train" / "data.jsonl").open()]
    math_rows = [r for r in rows if r["agent_ref"]["name"] == "math"]
    assert all(r["expected_answer"].lstrip("-").isdigit() for r in math_rows)
    messages = math_rows[0]["responses_create_params"]["input"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"].endswith("Reply with only the answer.")
    # Every RLVR stage mixes three environments, in train and held-out rows alike.
    for stage in TINY_RLVR.stages:
        splits = json.loads((prepared[stage.name] / "manifest.json").read_text())["splits"]
        for split in ("train", "val"):
            assert set(splits[split]["env_mix"]) == {
                "math",
                "instruction_following",
                "structured_outputs",
            }
    # prepared once: a second call (--resume) reuses the folders
    stamp = (prepared["rlvr1"] / "manifest.json").stat().st_mtime_ns
    prepare_data(TINY, tmp_path)
    assert (prepared["rlvr1"] / "manifest.json").stat().st_mtime_ns == stamp


def test_stage_result_reads_heldout_and_summary(tmp_path: Path) -> None:
    stage_dir = tmp_path / "stages" / "rlvr1"
    (stage_dir / "hf").mkdir(parents=True)
    assert not stage_done(stage_dir)
    (stage_dir / "heldout.json").write_text(
        json.dumps(
            {
                "before": {"reward": 0.25, "reward/math": 0.25},
                "after": {"reward": 0.5, "reward/math": 0.5},
            }
        )
    )
    (stage_dir / "summary.json").write_text(json.dumps({"step": 6, "checkpoint": "c"}))
    (stage_dir / "hf" / "config.json").write_text("{}")
    assert stage_done(stage_dir)
    result = stage_result(TINY.stages[0], stage_dir, wall_s=12.0)
    assert (result.stage, result.steps, result.wall_s) == ("rlvr1", 6, 12.0)
    assert (result.heldout_reward_before, result.heldout_reward_after) == (0.25, 0.5)
    assert result.heldout_by_env_after == {"math": 0.5}


def test_data_prep_rejects_a_bad_reasoning_gym_config(tmp_path: Path) -> None:
    blend = tmp_path / "bad.jsonl"
    row = {
        "_placeholder": {
            "source": "reasoning_gym",
            "task": "leg_counting",
            "index": 0,
            "config": {"max_animals": 0},
        },
        "agent_ref": {"name": "reasoning_gym"},
    }
    blend.write_text(json.dumps(row) + "\n")
    with pytest.raises(Exception, match=r"bad.jsonl:1: .*leg_counting.*max_animals"):
        prepare_rl(str(blend), PrepOptions(out=tmp_path / "out", val_rows=0))
