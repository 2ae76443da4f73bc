"""`rlfleet run --dry-run`: every stage of a pipeline as it would run, for this machine,
compose and a SLURM profile, with nothing started and nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rlfleet_cli.main import app
from typer.testing import CliRunner

# A SLURM profile with an image for every service (the plan is rendered, never submitted).
ENV_TOML = (Path(__file__).parent / "fixtures" / "slurm_env.toml").read_text()


def _run(tmp_path: Path, *args: str) -> tuple[int, str]:
    (tmp_path / "env.toml").write_text(ENV_TOML)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(app, ["run", "--dry-run", "--out", "runs/x", *args])
    finally:
        os.chdir(cwd)
    return result.exit_code, result.output


def test_local_plan_lists_six_stages_and_the_fleet_of_each(tmp_path: Path) -> None:
    code, text = _run(tmp_path)
    assert code == 0, text
    assert "# pipeline tiny: rlvr1 -> rlvr2 -> rlvr3 -> swe1 -> swe2 -> rlhf" in text
    assert text.count("## stage ") == 6
    assert "#   fleet: sandbox, reward, rollout, swe-runner" in text  # swe2
    assert "#   fleet: sandbox, judge, reward, rollout" in text  # rlhf
    assert "#   starts from: runs/x/stages/swe1/hf" in text
    assert "rlfleet-trainer eval --model <rlhf export>" in text
    assert not (tmp_path / "runs").exists()  # a plan writes nothing


def test_super3_renders_a_slurm_job_per_stage(tmp_path: Path) -> None:
    code, text = _run(tmp_path, "--pipeline", "super3", "--run", "cluster")
    assert code == 0, text
    assert text.count("#SBATCH --account=a") == 6, text[:3000]
    for stage in ("rlvr1", "rlvr2", "rlvr3", "swe1", "swe2", "rlhf"):
        assert "## stage " in text and f"recipe: super3/{stage}" in text


def test_compose_plan_and_stage_names(tmp_path: Path) -> None:
    code, text = _run(tmp_path, "--run", "compose", "--from", "swe2")
    assert code == 0, text
    assert text.count("## stage ") == 2 and "docker compose" in text
    assert "the rollout container serves smollm2-135m-instruct" in text
    code, text = _run(tmp_path, "--from", "nope")
    assert code != 0 and "--from nope: pipeline tiny has stages" in text


def test_to_names_a_stage_before_anything_is_written(tmp_path: Path) -> None:
    from rlfleet_pipeline.pipeline import PipelineError, RunSpec, run_pipeline

    with pytest.raises(PipelineError, match="--to nope: pipeline tiny has stages"):
        run_pipeline(tmp_path / "r", RunSpec(engine="hf"), resume=False, until="nope")
    assert not (tmp_path / "r").exists()


def test_a_pipeline_under_a_slurm_profile_is_refused_in_one_line_saying_what_runs(
    tmp_path: Path,
) -> None:
    """`rlfleet run` (not a dry run) with a SLURM profile: its launcher cannot run a
    pipeline; one line says how to run its stages, and nothing is started or written."""
    (tmp_path / "env.toml").write_text(ENV_TOML)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(app, ["run", "--run", "cluster", "--out", "runs/x"])
    finally:
        os.chdir(cwd)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("rlfleet: --run cluster: a pipeline runs locally or on compose")
    assert "rlfleet rl" in lines[0]
    assert not (tmp_path / "runs").exists()
