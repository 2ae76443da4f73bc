"""`rlfleet report` on a stage folder, on a pipeline folder and two runs side by side.
The folders are built from files recorded from real tiny stages (fixtures/runs/README.md):
a real `rlfleet run` is too slow for the suite. The stage report of a live `rlfleet rl`
run is in test_tracking.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from rlfleet_cli.main import app
from typer.testing import CliRunner

RECORDED = Path(__file__).parent / "fixtures" / "runs"


def stage_folder(root: Path, name: str) -> Path:
    shutil.copytree(RECORDED / name, root)
    return root


def pipeline_folder(root: Path, walls: dict[str, float]) -> Path:
    for name in ("rlvr1", "rlvr2"):
        stage_folder(root / "stages" / name, name)
    (root / "walls.json").write_text(json.dumps(walls))
    return root


def report(*args: str) -> str:
    result = CliRunner().invoke(app, ["report", *args])
    assert result.exit_code == 0, result.output
    return result.output


def metrics_rows(stage: str) -> list[dict[str, float]]:
    text = (RECORDED / stage / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_report_on_a_stage_folder(tmp_path: Path) -> None:
    stage = stage_folder(tmp_path / "rlvr1", "rlvr1")
    report(str(stage), "--html")
    md = (stage / "report.md").read_text()
    heldout = json.loads((stage / "heldout.json").read_text())
    assert (
        f"| rlvr1 | 3 | {heldout['before']['reward']:.3f} | {heldout['after']['reward']:.3f}" in md
    )
    assert "![rlvr1_reward](plots/rlvr1_reward.png)" in md
    assert (stage / "plots" / "rlvr1_reward.png").stat().st_size > 1000
    (entry,) = json.loads((stage / "report.json").read_text())["stages"]
    assert entry["stage"] == "rlvr1" and entry["steps"] == 3
    page = (stage / "report.html").read_text()
    assert "<table>" in page and page.count('src="data:image/png;base64,') == 3


def test_report_on_a_pipeline_folder_keeps_stage_order_and_walls(tmp_path: Path) -> None:
    run = pipeline_folder(tmp_path / "run", {"rlvr1": 61.0, "rlvr2": 50.0})
    # Stage order = start order (lineage.json's time), not the folder names' order.
    for name, when in (("rlvr2", 1_000), ("rlvr1", 2_000)):
        lineage = run / "stages" / name / "lineage.json"
        lineage.touch()
        os.utime(lineage, (when, when))
    report(str(run))
    md = (run / "report.md").read_text()
    assert md.index("| rlvr2 | 3 |") < md.index("| rlvr1 | 3 |")
    assert "| 61 s |" in md and "| 50 s |" in md
    assert {p.name for p in (run / "plots").glob("*.png")} >= {
        "rlvr1_reward.png",
        "rlvr2_reward.png",
        "heldout.png",
    }


def test_two_runs_side_by_side(tmp_path: Path) -> None:
    a = stage_folder(tmp_path / "a", "rlvr1")
    b = stage_folder(tmp_path / "b", "rlvr2")
    output = report(str(a), "--compare", str(b), "--html")
    assert str(a / "compare.md") in output and str(a / "compare.html") in output
    md = (a / "compare.md").read_text()
    assert "| stage | metric | a | b | Δ (B − A) |" in md
    last_a, last_b = (
        metrics_rows("rlvr1")[-1]["reward/mean"],
        metrics_rows("rlvr2")[-1]["reward/mean"],
    )
    assert f"| rlvr1 / rlvr2 | training reward, last step | {last_a:.4g} | {last_b:.4g} |" in md
    assert (a / "plots" / "compare_0.png").stat().st_size > 1000
    assert 'src="data:image/png;base64,' in (a / "compare.html").read_text()


def test_a_folder_that_is_no_run_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "RUN_DIR" in result.output and "not a run folder" in result.output
    stage = stage_folder(tmp_path / "s", "rlvr1")
    result = CliRunner().invoke(app, ["report", str(stage), "--compare", str(tmp_path / "nope")])
    assert (
        result.exit_code == 2 and "--compare" in result.output and "no such folder" in result.output
    )


def test_pipeline_stage_summaries_reach_the_trackers(tmp_path: Path) -> None:
    from rlfleet_core.tracking import LoggerConfig
    from rlfleet_pipeline.run_report import load_run, log_stage_summaries
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = load_run(pipeline_folder(tmp_path / "run", {"rlvr1": 61.0, "rlvr2": 50.0}))
    log_stage_summaries(run.root, LoggerConfig(tensorboard_enabled=True), "tiny", run.stages)
    events = EventAccumulator(str(run.root / "tensorboard"))
    events.Reload()
    after = [(e.step, e.value) for e in events.Scalars("pipeline/heldout_reward_after")]
    expected = [s.heldout_reward_after for s in run.stages]
    assert [step for step, _ in after] == [1, 2]
    assert [v for _, v in after] == [pytest.approx(v, abs=1e-6) for v in expected]
    walls = [e.value for e in events.Scalars("pipeline/wall_s")]
    assert walls == [s.wall_s for s in run.stages]


HOSTILE_STAGE = "<script>alert(1)</script>|x"
HOSTILE_ENV = '<img src=x onerror="alert(2)">'
LINK_ENV = "[click](https://evil.example/)"


def hostile_stage_folder(root: Path) -> Path:
    """A stage folder whose files carry HTML and markdown in the names the report shows:
    the stage's name (lineage.json) and environment names (heldout.json, metrics.jsonl)."""
    stage = stage_folder(root, "rlvr1")
    (stage / "lineage.json").write_text(json.dumps({"stage": HOSTILE_STAGE}))
    heldout = json.loads((stage / "heldout.json").read_text())
    for label in ("before", "after"):
        heldout[label][f"reward/{HOSTILE_ENV}"] = 0.5
        heldout[label][f"reward/{LINK_ENV}"] = 0.25
    (stage / "heldout.json").write_text(json.dumps(heldout))
    rows = metrics_rows("rlvr1")
    for row in rows:
        row[f"reward/{HOSTILE_ENV}"] = 0.5
    (stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return stage


def test_html_from_run_files_is_shown_not_run(tmp_path: Path) -> None:
    """Names from run files used to reach report.html as live HTML (a <script> ran when
    the report was opened). Now they show as written, and the page's CSP forbids any
    script or outside fetch besides."""
    stage = hostile_stage_folder(tmp_path / "s")
    report(str(stage), "--html")
    page = (stage / "report.html").read_text()
    assert "<script" not in page and "<img src=x" not in page, page[:3000]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;|x" in page  # the stage's name, as text
    assert "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in page
    assert 'href="https://evil.example/' not in page and "[click](https://evil.example/)" in page
    csp = page.split('http-equiv="Content-Security-Policy" content="')[1].split('"')[0]
    assert csp.startswith("default-src 'none'; img-src data:;") and "script-src" not in csp
    md = (stage / "report.md").read_text()
    # The stage's row keeps its six cells: the name's `|` cannot split it.
    row = next(line for line in md.splitlines() if line.startswith("| \\<script"))
    assert row.replace("\\|", "").count("|") == 7, row


def test_a_stage_name_cannot_place_plots_outside_the_folder(tmp_path: Path) -> None:
    stage = stage_folder(tmp_path / "run" / "s", "rlvr1")
    (stage / "lineage.json").write_text(json.dumps({"stage": "../../escaped"}))
    report(str(stage))
    assert [p.parent for p in tmp_path.rglob("*escaped_reward.png")] == [stage / "plots"]
