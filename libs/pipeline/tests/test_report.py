from __future__ import annotations

import json
from pathlib import Path

from rlfleet_pipeline.report import StageResult, reward_curves, write_report

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
    assert "| rlvr1 | — | 0.10 → 0.40 |" in text
    assert "| rlvr2 | 0.30 → 0.60 | — |" in text
    assert "nan" not in text
    data = json.loads((tmp_path / "report.json").read_text())
    assert [
        (s["stage"], s["heldout_reward_before"], s["heldout_reward_after"]) for s in data["stages"]
    ] == [("rlvr1", 0.2, 0.45), ("rlvr2", 0.45, 0.5)]
    for name in ("rlvr1_reward.png", "heldout.png"):
        png = (tmp_path / "plots" / name).read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
    assert not (tmp_path / "plots" / "rlvr2_reward.png").exists()  # no metrics, no curve
