"""The six-stage pipeline without services: which services each stage's fleet has,
--from/--to, lineage manifests, the stage measures and the regression table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlfleet_pipeline.lineage import stage_lineage, weights_sha256
from rlfleet_pipeline.pipeline import (
    PipelineError,
    RunSpec,
    data_dir,
    pipeline_of,
    stage_recipe,
    start_run,
)
from rlfleet_pipeline.pipeline_end import EndMeasures
from rlfleet_pipeline.pipelines import PIPELINES, TINY
from rlfleet_pipeline.report import StageResult, write_report
from rlfleet_pipeline.report_sections import end_of_run_sections, stage_measure, verdict
from rlfleet_pipeline.stage_plan import pipeline_fleet

ROLLOUT = ["engine=hf", "model=smollm2-135m-instruct"]


def _recipes(out: Path) -> list:  # type: ignore[type-arg]
    return [stage_recipe(TINY, i, out, data_dir(out, s), []) for i, s in enumerate(TINY.stages)]


def test_the_default_pipeline_is_the_six_stages() -> None:
    assert TINY.names() == ["rlvr1", "rlvr2", "rlvr3", "swe1", "swe2", "rlhf"]
    assert RunSpec().pipeline == TINY.name and set(PIPELINES) >= {"tiny", "tiny-rlvr", "super3"}


def test_one_fleet_adds_the_swe_runner_and_the_judge_only_while_needed(tmp_path: Path) -> None:
    plans = pipeline_fleet(_recipes(tmp_path), "hf", ROLLOUT, ("sandbox", "reward", "rollout"))
    services = {name: plan.services for name, plan in zip(TINY.names(), plans, strict=True)}
    assert services["rlvr1"] == services["swe1"] == ["sandbox", "reward", "rollout"]
    assert services["swe2"] == ["sandbox", "reward", "rollout", "swe-runner"]
    assert services["rlhf"] == ["sandbox", "judge", "reward", "rollout"]  # swe-runner stopped
    for plan in plans:  # the policy's rollout never changes: it is never restarted
        assert plan.given("rollout") == ROLLOUT
    swe2, rlhf = plans[4].settings, plans[5].settings
    assert any(o.startswith("episodes.tool_timeout_s=") for o in swe2["reward"])
    assert any(o.startswith("judge.prefill=") for o in rlhf["reward"])
    assert rlhf["judge"][:2] == ["engine=hf", "model=smollm2-135m-instruct"]
    # Without the end-of-run measurements, the sandbox goes once no stage needs it.
    bare = pipeline_fleet(_recipes(tmp_path), "hf", ROLLOUT)
    assert bare[5].services == ["judge", "reward", "rollout"]


def test_the_shared_rollout_serves_the_longest_stage(tmp_path: Path) -> None:
    from dataclasses import replace

    recipes = _recipes(tmp_path)
    assert TINY.rollout_settings("hf", recipes) == [
        "engine=hf",
        "model=smollm2-135m-instruct",
        "engine_config.max_model_len=2048",  # swe2's episodes
    ]
    longer = [stage_recipe(TINY, 0, tmp_path, data_dir(tmp_path, TINY.stages[0]),
                           ["policy.max_total_sequence_length=4096"])]  # fmt: skip
    assert TINY.shared_rollout(longer + recipes[1:]) == ["engine_config.max_model_len=4096"]
    fixed = replace(TINY, rollout=("engine_config.max_model_len=3000",))
    assert fixed.shared_rollout(recipes) == ["engine_config.max_model_len=3000"]


def test_from_and_to_name_stages_and_resume_keeps_the_start(tmp_path: Path) -> None:
    spec = RunSpec(engine="hf", model="tiny", first_stage="swe1")
    pipeline = pipeline_of(spec)
    assert pipeline.names() == ["swe1", "swe2", "rlhf"] and pipeline.model == "tiny"
    swe1 = stage_recipe(pipeline, 0, tmp_path, data_dir(tmp_path, pipeline.stages[0]), [])
    assert swe1.policy.model == "tiny"  # the chain starts at --from, from --model
    with pytest.raises(PipelineError, match="--from nope: pipeline tiny has stages rlvr1, rlvr2"):
        pipeline_of(RunSpec(first_stage="nope"))
    start_run(tmp_path, spec, resume=False)
    with pytest.raises(PipelineError, match="drop --model, --from and the overrides"):
        start_run(tmp_path, RunSpec(first_stage="rlhf"), resume=True)
    assert start_run(tmp_path, RunSpec(), resume=True)[0] == spec


def test_lineage_names_recipe_data_parent_and_code(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "train.jsonl").write_text('{"prompt": "x"}\n')
    recipe = stage_recipe(TINY, 1, tmp_path, tmp_path / "blend", []).model_copy()
    recipe = recipe.model_copy(
        update={
            "policy": recipe.policy.model_copy(update={"model": str(parent)}),
            "data": recipe.data.model_copy(update={"train_path": str(tmp_path / "train.jsonl")}),
        }
    )
    lineage = stage_lineage(recipe, "tiny/rlvr2", tmp_path / "stage")
    assert lineage["parent_model_path"] == str(parent.resolve())
    assert lineage["parent_weights_sha256"] == weights_sha256(parent) is not None
    assert len(lineage["data"]["train_sha256"]) == 64
    assert len(lineage["recipe_sha256"]) == 64
    assert set(lineage["code"]) == {"git_commit", "packages"}
    changed = recipe.model_copy(update={"grpo": recipe.grpo.model_copy(update={"lr": 1.0})})
    assert (
        stage_lineage(changed, "tiny/rlvr2", tmp_path)["recipe_sha256"] != lineage["recipe_sha256"]
    )


def _result(name: str, before: float, after: float, details: dict | None = None) -> StageResult:  # type: ignore[type-arg]
    return StageResult(name, before, after, heldout_details=details or {})


def test_each_stage_kind_reports_its_own_measure_and_says_when_it_did_not_move(
    tmp_path: Path,
) -> None:
    swe2 = _result("swe2", 0.0, 0.0, {"before": {"accuracy": 0.0}, "after": {"accuracy": 0.0}})
    measure = stage_measure(swe2, "swe2", tmp_path)
    assert measure["metric"] == "held-out resolve rate" and verdict(measure) == "did not move"
    (tmp_path / "genrm_win_rate.json").write_text(json.dumps({"win_rate": 0.75, "pairs": 64.0}))
    rlhf = stage_measure(_result("rlhf", 3.0, 3.1), "rlhf", tmp_path)
    assert (rlhf["before"], rlhf["after"], verdict(rlhf)) == (0.5, 0.75, "improved")
    (tmp_path / "genrm_win_rate.json").write_text(json.dumps({"win_rate": 0.75, "pairs": 4.0}))
    assert verdict(stage_measure(_result("rlhf", 0, 0), "rlhf", tmp_path)) == "within noise (±0.50)"
    dpo = _result(
        "dpo", 0, 0, {"before": {"hallucination_rate": 0.6}, "after": {"hallucination_rate": 0.5}}
    )
    assert verdict(stage_measure(dpo, "dpo", tmp_path)) == "improved"  # lower is better
    assert verdict(stage_measure(_result("rlvr1", 0.5, 0.25), "rlvr", tmp_path)) == "got worse"
    # With the held-out samples, a change inside two standard errors is noise.
    for label, rewards in (("before", [0, 1, 0, 1]), ("after", [1, 0, 1, 1])):
        lines = "".join(
            json.dumps({"prompt": i, "reward": r}) + "\n" for i, r in enumerate(rewards)
        )
        (tmp_path / f"heldout_{label}.jsonl").write_text(lines)
    noisy = stage_measure(_result("rlvr1", 0.5, 0.75), "rlvr", tmp_path)
    # Paired by prompt: the changes 1, -1, 1, 0 have variance 11/12, over 4 prompts.
    assert noisy["se"] == pytest.approx((11 / 12 / 4) ** 0.5)
    assert verdict(noisy).startswith("within noise (±")
    # Two samples a prompt: a prompt's samples move together, so they are not 8 draws.
    # Every prompt gains +0.5 (a sure change; as independent samples it was ±0.71).
    for label, rewards in (("before", [0, 1, 0, 1, 0, 1, 0, 1]), ("after", [1] * 8)):
        lines = "".join(
            json.dumps({"prompt": i // 2, "reward": r}) + "\n" for i, r in enumerate(rewards)
        )
        (tmp_path / f"heldout_{label}.jsonl").write_text(lines)
    sure = stage_measure(_result("rlvr1", 0.5, 1.0), "rlvr", tmp_path)
    assert sure["se"] == 0.0 and verdict(sure) == "improved"
    # Different prompts before and after (a failed prompt): independent samples.
    (tmp_path / "heldout_after.jsonl").write_text(
        "".join(json.dumps({"prompt": i, "reward": 1}) + "\n" for i in range(3))
    )
    unpaired = stage_measure(_result("rlvr1", 0.5, 1.0), "rlvr", tmp_path)
    assert unpaired["se"] == pytest.approx((2 / 7 / 8) ** 0.5)
    assert (
        verdict(stage_measure(_result("rlhf", 0, 0), "rlhf", tmp_path / "none")) == "not measured"
    )


def test_the_report_has_the_measures_and_the_regression_table(tmp_path: Path) -> None:
    stages = [_result(n, 0.2, 0.4) for n in TINY.names()]
    regression = tmp_path / "regression"
    regression.mkdir()
    (regression / "results.json").write_text(
        json.dumps({"rlvr1": {"reward": 0.3}, "swe1": {"reward": 0.4}})
    )
    assert [s.name for s in EndMeasures(tmp_path, TINY).regression_stages()] == [
        "rlvr1", "rlvr2", "rlvr3", "swe1"
    ]  # fmt: skip
    report = write_report(tmp_path, stages, end_of_run_sections(tmp_path, stages))
    text = report.read_text()
    assert "| rlvr1 | 0.400 | 0.300 | -0.100 |" in text
    assert "| swe1 | 0.400 | 0.400 | +0.000 |" in text
    assert "| swe2 | held-out resolve rate | — | — | not measured |" in text
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["regression"][0] == {"stage": "rlvr1", "after_stage": 0.4, "at_end": 0.3}
    assert data["measures"]["rlvr2"]["outcome"] == "improved"
