"""The end-of-run report: a metrics table, reward curves per environment (PNG) and
held-out reward before/after each stage, as report.md, report.json and plots/.

Inputs are what stages leave in their folders: `metrics.jsonl` (one object per step with
`step`, `reward/mean`, `reward/<env>`, ...) and a `StageResult` per stage.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
from rlfleet_contracts.run_folder import PipelineFolder


@dataclass
class StageResult:
    stage: str
    heldout_reward_before: float
    heldout_reward_after: float
    heldout_by_env_before: dict[str, float] = field(default_factory=dict)
    heldout_by_env_after: dict[str, float] = field(default_factory=dict)
    steps: int = 0
    wall_s: float = 0.0
    checkpoint: str = ""
    metrics_path: str = ""


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reward_curves(rows: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """`reward/<env>` (and `reward/mean`) series over steps: name → (steps, values)."""
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for i, row in enumerate(rows):
        step = float(row.get("step", i + 1))
        for key, value in row.items():
            if key.startswith("reward/") and isinstance(value, int | float):
                xs, ys = curves.setdefault(key.removeprefix("reward/"), ([], []))
                xs.append(step)
                ys.append(float(value))
    return curves


def plot_stage(stage: StageResult, rows: list[dict[str, Any]], path: Path) -> Path | None:
    curves = reward_curves(rows)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (xs, ys) in sorted(curves.items()):
        ax.plot(
            xs, ys, marker="o", markersize=3, linewidth=2.5 if name == "mean" else 1.2, label=name
        )
    ax.axhline(stage.heldout_reward_before, color="grey", linestyle=":", label="held-out before")
    ax.axhline(stage.heldout_reward_after, color="black", linestyle="--", label="held-out after")
    ax.set(title=f"{stage.stage}: training reward per environment", xlabel="step", ylabel="reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_heldout(stages: list[StageResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(1.8 * len(stages) + 2, 3.5))
    xs = range(len(stages))
    ax.bar([x - 0.2 for x in xs], [s.heldout_reward_before for s in stages], 0.4, label="before")
    ax.bar([x + 0.2 for x in xs], [s.heldout_reward_after for s in stages], 0.4, label="after")
    ax.set_xticks(list(xs), [s.stage for s in stages])
    ax.set(title="held-out reward per stage", ylabel="reward")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dir: Path, stages: list[StageResult]) -> Path:
    """Write report.json, report.md and plots/ under run_dir; return report.md."""
    folder = PipelineFolder(run_dir)
    plots = []
    lines = [
        "# rlfleet run report",
        "",
        "| stage | steps | held-out before | held-out after | Δ | wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for stage in stages:
        delta = stage.heldout_reward_after - stage.heldout_reward_before
        lines.append(
            f"| {stage.stage} | {stage.steps} | {stage.heldout_reward_before:.3f} | "
            f"{stage.heldout_reward_after:.3f} | {delta:+.3f} | {stage.wall_s:.0f} s |"
        )
        rows = read_metrics(Path(stage.metrics_path)) if stage.metrics_path else []
        png = plot_stage(stage, rows, folder.plots / f"{stage.stage}_reward.png")
        if png:
            plots.append(png)
    envs = sorted({e for s in stages for e in (*s.heldout_by_env_before, *s.heldout_by_env_after)})
    if envs:
        lines += [
            "",
            "Held-out reward per environment (before → after):",
            "",
            "| stage | " + " | ".join(envs) + " |",
            "| --- |" + " ---: |" * len(envs),
        ]
        for s in stages:
            cells = [
                f"{_cell(s.heldout_by_env_before.get(e))} → {_cell(s.heldout_by_env_after.get(e))}"
                if e in s.heldout_by_env_before or e in s.heldout_by_env_after
                else "—"  # the stage's blend has no such environment
                for e in envs
            ]
            lines.append(f"| {s.stage} | " + " | ".join(cells) + " |")
    if stages:
        plots.append(plot_heldout(stages, folder.plots / "heldout.png"))
    lines += ["", *[f"![{p.stem}]({p.relative_to(run_dir)})" for p in plots]]
    folder.report_json.write_text(
        json.dumps({"stages": [asdict(s) for s in stages]}, indent=2) + "\n"
    )
    report = folder.report_md
    report.write_text("\n".join(lines) + "\n")
    return report


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
