"""`rlfleet report` for any run folder: a stage folder (`rlfleet rl`) or a pipeline folder
(`rlfleet run`), read back from what the stages left (report.py does the writing), and
the comparison of two runs side by side (reward curves overlaid, one summary table).
Also the pipeline's stage summaries for the trackers of the recipes' `logger` section."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
from rlfleet_contracts.run_folder import PipelineFolder, StageFolder
from rlfleet_core.tracking import LoggerConfig, MetricsLogger

from rlfleet_pipeline.report import (
    StageResult,
    heldout_failures,
    md_text,
    read_metrics,
    reward_curves,
    write_report,
)

NAN = float("nan")


class NotARunFolder(ValueError):
    """The folder holds neither a stage's nor a pipeline's files."""


@dataclass
class Run:
    root: Path
    kind: str
    """"stage" (one `rlfleet rl` stage) or "pipeline" (`rlfleet run`, stages/<name>/)."""
    stages: list[StageResult]

    @property
    def name(self) -> str:
        return self.root.resolve().name


def stage_result_from_folder(name: str, stage_dir: Path, wall_s: float = 0.0) -> StageResult:
    """A stage's result from its folder; a stage still running (no summary.json, no
    held-out `after`) reads with the steps it logged so far and NaN for what is missing."""
    folder = StageFolder(stage_dir)
    heldout = _json(folder.heldout)
    summary = _json(folder.summary)

    def split(result: dict[str, Any]) -> tuple[float, dict[str, float]]:
        # Only `reward/<env>` keys are environments; failure counts sit in `failures`.
        by_env = {
            k.removeprefix("reward/"): v for k, v in result.items() if k.startswith("reward/")
        }
        return float(result.get("reward", NAN)), by_env

    before, before_env = split(heldout.get("before", {}))
    after, after_env = split(heldout.get("after", {}))
    rows = read_metrics(folder.metrics) if "step" not in summary else []
    return StageResult(
        stage=name,
        heldout_reward_before=before,
        heldout_reward_after=after,
        heldout_by_env_before=before_env,
        heldout_by_env_after=after_env,
        steps=int(summary["step"]) if "step" in summary else int(rows[-1]["step"]) if rows else 0,
        wall_s=wall_s,
        checkpoint=str(summary.get("checkpoint", "")),
        metrics_path=str(folder.metrics),
        heldout_failures=heldout_failures(heldout),
        heldout_details={
            label: {k: float(v) for k, v in values.items()}
            for label, values in heldout.get("details", {}).items()
            if isinstance(values, dict)
        },
    )


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


STAGE_FILES = ("metrics.jsonl", "heldout.json", "summary.json")


def load_run(root: Path) -> Run:
    """The run in `root`: a pipeline folder when it has stages/<name>/, else a stage
    folder when it has a stage's files."""
    if not root.is_dir():
        raise NotARunFolder(f"{root}: no such folder")
    stages_dir = root / "stages"
    stage_dirs = [d for d in stages_dir.iterdir() if d.is_dir()] if stages_dir.is_dir() else []
    if stage_dirs:
        walls = _json(PipelineFolder(root).walls)
        # Stages in the order they started (lineage.json is written as a stage starts).
        stage_dirs.sort(key=lambda d: (_started(d), d.name))
        stages = [
            stage_result_from_folder(d.name, d, float(walls.get(d.name, 0.0))) for d in stage_dirs
        ]
        return Run(root, "pipeline", stages)
    if any((root / f).is_file() for f in STAGE_FILES):
        name = str(_json(StageFolder(root).lineage).get("stage") or root.resolve().name)
        # `rlfleet rl` timed the stage in its report.json; a report written again keeps it.
        earlier = _json(PipelineFolder(root).report_json).get("stages") or [{}]
        wall = earlier[0].get("wall_s", 0.0) if isinstance(earlier[0], dict) else 0.0
        return Run(root, "stage", [stage_result_from_folder(name, root, float(wall))])
    raise NotARunFolder(
        f"{root}: not a run folder (no stages/ and none of {', '.join(STAGE_FILES)})"
    )


def _started(stage_dir: Path) -> float:
    lineage = StageFolder(stage_dir).lineage
    return lineage.stat().st_mtime if lineage.exists() else math.inf


def report_run(run: Run) -> Path:
    """report.md, report.json and plots/ in the run folder (a pipeline's with each stage's
    measure and the regression table); returns report.md."""
    from rlfleet_pipeline.report_sections import end_of_run_sections

    sections = end_of_run_sections(run.root, run.stages) if run.kind == "pipeline" else None
    return write_report(run.root, run.stages, sections)


@dataclass
class StageSummary:
    steps: int
    heldout_before: float
    heldout_after: float
    reward_last: float
    reward_mean: float
    loss_last: float
    wall_s: float

    ROWS = (
        ("steps", "steps"),
        ("held-out before", "heldout_before"),
        ("held-out after", "heldout_after"),
        ("training reward, last step", "reward_last"),
        ("training reward, mean", "reward_mean"),
        ("loss, last step", "loss_last"),
        ("wall (s)", "wall_s"),
    )


def summarize(stage: StageResult) -> StageSummary:
    rows = read_metrics(Path(stage.metrics_path)) if stage.metrics_path else []
    rewards = [float(r["reward/mean"]) for r in rows if _number(r.get("reward/mean"))]
    losses = [float(r["loss"]) for r in rows if _number(r.get("loss"))]
    return StageSummary(
        steps=stage.steps,
        heldout_before=stage.heldout_reward_before,
        heldout_after=stage.heldout_reward_after,
        reward_last=rewards[-1] if rewards else NAN,
        reward_mean=sum(rewards) / len(rewards) if rewards else NAN,
        loss_last=losses[-1] if losses else NAN,
        wall_s=stage.wall_s,
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compare_runs(a: Run, b: Run, out: Path) -> Path:
    """compare.md in `out` (plots under out/plots/): the runs' stages paired in order,
    each pair's reward curves overlaid, and one table of both runs' summaries."""
    label_a, label_b = a.name, b.name
    if label_a == label_b:
        label_a, label_b = str(a.root), str(b.root)
    md_a, md_b = md_text(label_a), md_text(label_b)
    lines = [
        f"# rlfleet comparison: {md_a} vs {md_b}",
        "",
        f"| stage | metric | {md_a} | {md_b} | Δ (B − A) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    plots = []
    for i in range(max(len(a.stages), len(b.stages))):
        sa = a.stages[i] if i < len(a.stages) else None
        sb = b.stages[i] if i < len(b.stages) else None
        title = " / ".join(dict.fromkeys(s.stage for s in (sa, sb) if s is not None))
        va, vb = (summarize(s) if s else None for s in (sa, sb))
        for label, attr in StageSummary.ROWS:
            x = getattr(va, attr) if va else NAN
            y = getattr(vb, attr) if vb else NAN
            lines.append(f"| {md_text(title)} | {label} | {_fmt(x)} | {_fmt(y)} | {_delta(x, y)} |")
        png = plot_pair(title, (label_a, sa), (label_b, sb), out / "plots" / f"compare_{i}.png")
        if png:
            plots.append(png)
    lines += ["", *[f"![{md_text(p.stem)}]({p.relative_to(out)})" for p in plots]]
    path = out / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_pair(
    title: str, a: tuple[str, StageResult | None], b: tuple[str, StageResult | None], path: Path
) -> Path | None:
    """Both runs' reward curves on one plot: A solid, B dashed, one colour per series."""
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = False
    for (label, stage), style in ((a, "-"), (b, "--")):
        if stage is None or not stage.metrics_path:
            continue
        curves = reward_curves(read_metrics(Path(stage.metrics_path)))
        for k, (name, (xs, ys)) in enumerate(sorted(curves.items())):
            width = 2.5 if name == "mean" else 1.2
            ax.plot(xs, ys, style, color=f"C{k}", marker="o", markersize=3, linewidth=width,
                    label=f"{label}: {name}")  # fmt: skip
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set(title=f"{title}: training reward (A solid, B dashed)", xlabel="step", ylabel="reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "—"
    return f"{value:.0f}" if float(value).is_integer() and abs(value) >= 1 else f"{value:.4g}"


def _delta(x: float, y: float) -> str:
    d = float(y) - float(x)
    return "—" if math.isnan(d) else f"{d:+.4g}"


def log_stage_summaries(
    out: Path, config: LoggerConfig, name: str, stages: list[StageResult]
) -> None:
    """One tracker step per stage (step = stage number) with its held-out reward before
    and after, its steps and wall time; nothing when `config` enables no tracker."""
    if not (config.tensorboard_enabled or config.wandb_enabled or config.mlflow_enabled):
        return
    with MetricsLogger(out, config, run_name=name) as log:
        for index, stage in enumerate(stages, start=1):
            log.log(
                index,
                {
                    "pipeline/heldout_reward_before": stage.heldout_reward_before,
                    "pipeline/heldout_reward_after": stage.heldout_reward_after,
                    "pipeline/steps": float(stage.steps),
                    "pipeline/wall_s": stage.wall_s,
                },
            )
