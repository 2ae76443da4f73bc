from __future__ import annotations

import json
from pathlib import Path

from rlfleet_pipeline.pipeline import stage_result
from rlfleet_pipeline.pipelines import TINY
from rlfleet_pipeline.report import StageResult, read_metrics, reward_curves, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_reward_curves_per_environment() -> None:
    rows = [
        {"step": 1, "reward/mean": 0.2, "reward/math": 0.1, "loss": 3.0},
        {"step": 2, "reward/mean": 0.4, "reward/math": 0.5, "reward/code": 0.3},
    ]
    curves = reward_curves(rows)
    assert curves["math"] == ([1.0, 2.0], [0.1, 0.5])
    assert curves["code"] == ([2.0], [0.3])
    assert "loss" not in curves


def test_report_files(tmp_path: Path) -> None:
    metrics = tmp_path / "rlvr1" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text(
        "".join(
            json.dumps({"step": i, "reward/mean": i / 10, "reward/math": i / 20}) + "\n"
            for i in range(1, 6)
        )
    )
    stages = [
        StageResult(
            "rlvr1",
            0.2,
            0.45,
            {"math": 0.1},
            {"math": 0.4},
            steps=5,
            wall_s=60,
            metrics_path=str(metrics),
        ),
        StageResult("rlvr2", 0.45, 0.5, {"code": 0.3}, {"code": 0.6}, steps=3),
    ]
    report = write_report(tmp_path, stages)
    text = report.read_text()
    assert "| rlvr1 | 5 | 0.200 | 0.450 | +0.250 | 60 s |" in text
    # One column per environment; a stage without it shows a dash, not "nan".
    assert "| rlvr1 | — | 0.10 → 0.40 (+0.30) |" in text
    assert "| rlvr2 | 0.30 → 0.60 (+0.30) | — |" in text
    assert "nan" not in text
    data = json.loads((tmp_path / "report.json").read_text())
    assert [
        (s["stage"], s["heldout_reward_before"], s["heldout_reward_after"]) for s in data["stages"]
    ] == [("rlvr1", 0.2, 0.45), ("rlvr2", 0.45, 0.5)]
    for name in ("rlvr1_reward.png", "heldout.png", "heldout_by_env.png"):
        png = (tmp_path / "plots" / name).read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert not (tmp_path / "plots" / "rlvr2_reward.png").exists()  # no metrics, no curve


def _stage_folder(root: Path, rows: list[dict[str, object]], heldout: dict[str, object]) -> Path:
    """A finished stage folder as the trainer leaves it."""
    stage_dir = root / "stages" / "rlvr1"
    stage_dir.mkdir(parents=True)
    (stage_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (stage_dir / "heldout.json").write_text(json.dumps(heldout))
    (stage_dir / "summary.json").write_text(json.dumps({"step": len(rows)}))
    return stage_dir


def _failures(groups: int, samples: int, retries: int, streak: int) -> dict[str, float]:
    return {
        "failures/groups": float(groups),
        "failures/samples": float(samples),
        "failures/retries": float(retries),
        "failures/failing_steps": float(streak),
    }


def test_report_counts_failures_per_stage(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"step": 1, "reward/mean": 0.1, **_failures(0, 0, 2, 0)},
        # step 2 lost more groups than its budget twice: two failing steps in one
        {"step": 2, "reward/mean": 0.2, **_failures(5, 20, 3, 2)},
        {"step": 3, "reward/mean": 0.3, **_failures(1, 4, 0, 3)},
        {"step": 4, "reward/mean": 0.4, **_failures(0, 0, 1, 0)},
        {"step": 5, "reward/mean": 0.5, **_failures(0, 0, 0, 0)},
        {"step": 6, "reward/mean": 0.6, **_failures(9, 36, 9, 0)},
        # resumed from the step-5 checkpoint: step 6 again, the run's own
        {"step": 6, "reward/mean": 0.6, **_failures(1, 4, 0, 1)},
        {"step": 7, "val/reward": 0.4, "val/failed_prompts": 2.0, "val/failed_samples": 3.0},
    ]
    heldout = {
        "before": {"reward": 0.2, "reward/math": 0.2},
        "after": {"reward": 0.5, "reward/math": 0.5},
        "failures": {
            "before": {"failed_prompts": 1, "failed_samples": 2},
            "after": {"failed_prompts": 0, "failed_samples": 1},
        },
    }
    stage_dir = _stage_folder(tmp_path, rows, heldout)
    result = stage_result(TINY.stages[0], stage_dir, wall_s=1.0)
    # `failures` is not an environment of the held-out reward
    assert result.heldout_by_env_before == {"math": 0.2}
    assert result.heldout_by_env_after == {"math": 0.5}

    text = write_report(tmp_path, [result]).read_text()
    assert (
        "- rlvr1: 7 groups dropped (28 samples failed), 6 retries, 4 failing steps; "
        "held-out: 3 prompts left out (6 samples without a reward)"
    ) in text
    assert "no failures" not in text
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["stages"][0]["heldout_failures"] == heldout["failures"]
    assert data["stages"][0]["failures"] == {
        "groups": 7,
        "samples": 28,
        "retries": 6,
        "failing_steps": 4,
        "heldout_failed_prompts": 3,
        "heldout_failed_samples": 6,
    }
    png = (tmp_path / "plots" / "rlvr1_reward.png").read_bytes()
    assert png.startswith(PNG_MAGIC)


def test_report_without_failure_keys_says_no_failures(tmp_path: Path) -> None:
    """A run folder from before the failure metrics: no `failures/*`, no `val/failed_*`,
    no `failures` in heldout.json."""
    rows: list[dict[str, object]] = [
        {"step": i, "reward/mean": i / 10, "reward/math": i / 10} for i in range(1, 4)
    ]
    heldout = {"before": {"reward": 0.1, "reward/math": 0.1}, "after": {"reward": 0.3}}
    stage_dir = _stage_folder(tmp_path, rows, heldout)
    result = stage_result(TINY.stages[0], stage_dir, wall_s=1.0)
    text = write_report(tmp_path, [result]).read_text()
    assert "- rlvr1: no failures" in text
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["stages"][0]["failures"] == {
        "groups": 0,
        "samples": 0,
        "retries": 0,
        "failing_steps": 0,
        "heldout_failed_prompts": 0,
        "heldout_failed_samples": 0,
    }
    assert (tmp_path / "plots" / "rlvr1_reward.png").read_bytes().startswith(PNG_MAGIC)


def test_report_shows_the_heldout_tool_call_rates(tmp_path: Path) -> None:
    """A stage whose held-out set is multi-turn (a DPO stage's): hallucination and
    valid-call rates before → after, in report.md and report.json; a DPO stage's
    metrics (loss, no reward) still make a report."""
    rows: list[dict[str, object]] = [{"step": i, "loss": 0.7 - i / 10} for i in range(1, 4)]
    heldout = {
        "before": {"reward": 0.0, "reward/tool_use": 0.0},
        "after": {"reward": 0.05, "reward/tool_use": 0.05},
        "details": {
            "before": {"accuracy": 0.0, "hallucination_rate": 0.5, "valid_call_rate": 0.1},
            "after": {"accuracy": 0.05, "hallucination_rate": 0.25, "valid_call_rate": 0.3},
        },
    }
    result = stage_result(TINY.stages[0], _stage_folder(tmp_path, rows, heldout), wall_s=1.0)
    text = write_report(tmp_path, [result]).read_text()
    assert "| rlvr1 | 0.50 → 0.25 (-0.25) | 0.10 → 0.30 (+0.20) |" in text
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["stages"][0]["heldout_details"]["after"]["hallucination_rate"] == 0.25


def test_odd_failure_values_count_as_zero(tmp_path: Path) -> None:
    """Hand-edited or truncated files must not crash the report: non-numbers, NaN and
    a `failures` entry of the wrong shape read as no failures."""
    rows: list[dict[str, object]] = [
        {"step": 1, "reward/mean": 0.1, "failures/groups": "x", "failures/samples": None},
        {"step": 2, "reward/mean": 0.2, "failures/retries": True},
    ]
    stage_dir = _stage_folder(tmp_path, rows, {"before": {"reward": 0.1}, "failures": [1]})
    (stage_dir / "metrics.jsonl").write_text(
        (stage_dir / "metrics.jsonl").read_text() + '{"step": 3, "failures/groups": NaN}\n'
    )
    result = stage_result(TINY.stages[0], stage_dir, wall_s=1.0)
    assert result.heldout_failures == {}
    assert "- rlvr1: no failures" in write_report(tmp_path, [result]).read_text()


def test_read_metrics_after_a_crash_and_resume(tmp_path: Path) -> None:
    """Killed while writing step 6, resumed from the step-3 checkpoint: the resumed run's
    step 4 lands on the cut line (that line is lost), its step 5 replaces the old one."""
    path = tmp_path / "metrics.jsonl"
    old = [{"step": i, "reward/mean": i / 10, "run": "old"} for i in range(1, 6)]
    new = [{"step": i, "reward/mean": i / 10, "run": "new"} for i in (4, 5)]
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in old)
        + '{"step": 6, "rew'
        + "".join(json.dumps(r) + "\n" for r in new)
        + "[1, 2]\n"  # not an object: left out
    )
    rows = read_metrics(path)
    assert [(r["step"], r["run"]) for r in rows] == [
        (1, "old"),
        (2, "old"),
        (3, "old"),
        (4, "old"),
        (5, "new"),
    ]
    # a cut-short last line (read while the trainer writes it) is left out too
    path.write_text(json.dumps(old[0]) + "\n" + '{"step": 2, "rew')
    assert read_metrics(path) == [old[0]]


def test_report_shows_kl_and_the_judges_throughput(tmp_path: Path) -> None:
    """An RLHF stage: the last step's KL and the judge's comparisons per second of busy
    time over all steps (24 comparisons / 8 s = 3.00); an RLVR stage (KL 0, no judge)
    gets no such line."""
    rows = {
        "rlvr1": [{"step": 1, "reward/mean": 0.1, "kl": 0.0}],
        "rlhf": [
            {"step": 1, "kl": 0.0, "genrm/comparisons": 16.0, "genrm/busy_s": 6.0},
            {"step": 2, "kl": 0.0042, "genrm/comparisons": 8.0, "genrm/busy_s": 2.0},
        ],
    }
    stages = []
    for name, steps in rows.items():
        path = tmp_path / name / "metrics.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in steps))
        stages.append(StageResult(name, 0.0, 0.0, steps=len(steps), metrics_path=str(path)))
    report = write_report(tmp_path, stages)
    assert "- rlhf: KL 0.0042; 24 judge comparisons, 3.00 comparisons/s" in report.read_text()
    assert "- rlvr1: KL" not in report.read_text()
    saved = json.loads((tmp_path / "report.json").read_text())["stages"]
    assert "kl_last" not in saved[0] and "genrm_comparisons" not in saved[0]
    assert saved[1]["kl_last"] == 0.0042 and saved[1]["genrm_comparisons_per_s"] == 3.0
