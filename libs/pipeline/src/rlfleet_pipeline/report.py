"""The end-of-run report: a metrics table, reward curves per environment (PNG),
held-out reward before/after each stage and what each stage lost to failures, as
report.md, report.json and plots/.

Inputs are what stages leave in their folders: `metrics.jsonl` (one object per step with
`step`, `reward/mean`, `reward/<env>`, `failures/*`, `val/failed_*`, ...) and a
`StageResult` per stage. Run folders older than the failure metrics read as no failures.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt
from rlfleet_contracts.run_folder import PipelineFolder

logger = logging.getLogger(__name__)

_MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]<>|&])")


def md_text(value: object) -> str:
    """Text from a run's files (stage and environment names, metric labels) as literal
    markdown: a name like `<script>` or `[x](http://...)` shows as written, in report.md
    and in the HTML made from it, and a `|` or a newline cannot break a table row."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(value).split()))


def file_stem(name: str) -> str:
    """A stage's name as a file name inside plots/: a name from a run file (lineage.json)
    must not reach `../` or another folder, nor break the markdown image link."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".")
    return stem or "stage"


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
    heldout_failures: dict[str, dict[str, float]] = field(default_factory=dict)
    """heldout.json's `failures`: validation label → {failed_prompts, failed_samples}."""
    heldout_details: dict[str, dict[str, float]] = field(default_factory=dict)
    """heldout.json's `details`: validation label → {accuracy, hallucination_rate, ...}."""


@dataclass
class FailureTotals:
    """What one stage lost to failures (docs/trainer.md, "Failures")."""

    groups: int = 0
    """Prompt groups dropped (and replaced) after their retries failed."""
    samples: int = 0
    """Samples of those groups left without a result."""
    retries: int = 0
    """Generate / ScoreGroup calls tried again (validation's included)."""
    failing_steps: int = 0
    """Steps that lost more groups than grpo.max_failed_group_fraction allows."""
    heldout_failed_prompts: int = 0
    """Held-out prompts left out, over every validation (before, periodic, after)."""
    heldout_failed_samples: int = 0

    def any(self) -> bool:
        return any(asdict(self).values())


def heldout_failures(heldout: dict[str, Any]) -> dict[str, dict[str, float]]:
    """heldout.json's `failures` entry; {} for a file written before it existed."""
    failures = heldout.get("failures")
    if not isinstance(failures, dict):
        return {}
    return {
        label: {k: v for k, v in counts.items() if _is_number(v) and math.isfinite(v)}
        for label, counts in failures.items()
        if isinstance(counts, dict)
    }


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The stage's steps in order, as the run went on. A trainer resumed from its step-k
    checkpoint logs the steps after k again: those rows replace the ones logged before.
    A line cut short (the trainer was killed while writing it) is left out."""
    if not path.exists():
        return []
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            logger.warning("%s:%d: not a JSON object (a line cut short?); left out", path, n)
            continue
        if not isinstance(row, dict):
            continue
        step = row.get("step")
        while rows and _is_number(step) and _is_number(rows[-1].get("step")):
            if rows[-1]["step"] < step:
                break
            rows.pop()
        rows.append(row)
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def failure_totals(stage: StageResult, rows: list[dict[str, Any]]) -> FailureTotals:
    totals = FailureTotals()
    streak = 0
    for row in rows:
        totals.groups += _count(row.get("failures/groups"))
        totals.samples += _count(row.get("failures/samples"))
        totals.retries += _count(row.get("failures/retries"))
        totals.heldout_failed_prompts += _count(row.get("val/failed_prompts"))
        totals.heldout_failed_samples += _count(row.get("val/failed_samples"))
        # `failures/failing_steps` is the streak after the step (0 once a step is within
        # budget; one step can add more than one). A streak that shrank without reaching 0
        # started over on resume.
        now = _count(row.get("failures/failing_steps"))
        totals.failing_steps += now - streak if now > streak else now
        streak = now
    for counts in stage.heldout_failures.values():
        totals.heldout_failed_prompts += _count(counts.get("failed_prompts"))
        totals.heldout_failed_samples += _count(counts.get("failed_samples"))
    return totals


def kl_and_judge(rows: list[dict[str, Any]]) -> dict[str, float]:
    """A stage's KL to its reference (the last step's `kl`, when some step had one above
    0) and its GenRM judge's work (`genrm/*` summed: comparisons, and comparisons per
    second of judged-group busy time). {} for a stage with neither."""
    out: dict[str, float] = {}
    kls = [float(r["kl"]) for r in rows if _is_number(r.get("kl"))]
    if any(k > 0 for k in kls):
        out["kl_last"] = kls[-1]
    calls = sum(_count(r.get("genrm/comparisons")) for r in rows)
    busy = sum(float(r["genrm/busy_s"]) for r in rows if _is_number(r.get("genrm/busy_s")))
    if calls:
        out["genrm_comparisons"] = float(calls)
        out["genrm_comparisons_per_s"] = calls / busy if busy > 0 else 0.0
    return out


def _count(value: Any) -> int:
    """A count from a metrics value; 0 for a missing key (older run folders) or a value
    that is not a finite number."""
    if not _is_number(value) or not math.isfinite(value):
        return 0
    return max(int(value), 0)


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
    dropped = [
        float(row.get("step", i + 1))
        for i, row in enumerate(rows)
        if _count(row.get("failures/groups"))
    ]
    for n, step in enumerate(dropped):
        # One faint line per step that dropped groups; its reward is over fewer prompts.
        label = "groups dropped" if n == 0 else None
        ax.axvline(step, color="red", alpha=0.25, linewidth=4, zorder=0, label=label)
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


def plot_heldout_by_env(stages: list[StageResult], envs: list[str], path: Path) -> Path:
    """Held-out reward before (faint) and after (solid) per environment, for each stage:
    a mixed stage must not buy one environment's gain with another's loss."""
    fig, ax = plt.subplots(figsize=(1.2 * len(stages) * len(envs) + 2, 3.8))
    width = 0.8 / len(envs)
    for k, env in enumerate(envs):
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(stages))]
        before = [s.heldout_by_env_before.get(env, float("nan")) for s in stages]
        after = [s.heldout_by_env_after.get(env, float("nan")) for s in stages]
        bars = ax.bar(xs, after, width * 0.9, label=env)
        ax.bar(xs, before, width * 0.9, color=bars.patches[0].get_facecolor(), alpha=0.3)
    ax.set_xticks(list(range(len(stages))), [s.stage for s in stages])
    ax.set(title="held-out reward per environment (faint: before)", ylabel="reward")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dir: Path, stages: list[StageResult], sections: Any | None = None) -> Path:
    """Write report.json, report.md and plots/ under run_dir; return report.md.
    `sections` (report_sections.Sections: markdown `lines`, JSON `data`) adds a pipeline's
    stage measures and regression table."""
    folder = PipelineFolder(run_dir)
    plots = []
    totals = []
    extras = []
    lines = [
        "# rlfleet run report",
        "",
        "| stage | steps | held-out before | held-out after | Δ | wall |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for stage in stages:
        delta = stage.heldout_reward_after - stage.heldout_reward_before
        lines.append(
            f"| {md_text(stage.stage)} | {stage.steps} | {stage.heldout_reward_before:.3f} | "
            f"{stage.heldout_reward_after:.3f} | {delta:+.3f} | {stage.wall_s:.0f} s |"
        )
        rows = read_metrics(Path(stage.metrics_path)) if stage.metrics_path else []
        totals.append(failure_totals(stage, rows))
        extras.append(kl_and_judge(rows))
        png = plot_stage(stage, rows, folder.plots / f"{file_stem(stage.stage)}_reward.png")
        if png:
            plots.append(png)
    envs = sorted({e for s in stages for e in (*s.heldout_by_env_before, *s.heldout_by_env_after)})
    if envs:
        lines += [
            "",
            "Held-out reward per environment (before → after):",
            "",
            "| stage | " + " | ".join(md_text(e) for e in envs) + " |",
            "| --- |" + " ---: |" * len(envs),
        ]
        for s in stages:
            cells = [
                _env_cell(s.heldout_by_env_before.get(e), s.heldout_by_env_after.get(e))
                if e in s.heldout_by_env_before or e in s.heldout_by_env_after
                else "—"  # the stage's blend has no such environment
                for e in envs
            ]
            lines.append(f"| {md_text(s.stage)} | " + " | ".join(cells) + " |")
    if sections is not None:
        lines += sections.lines
    lines += _tool_call_lines(stages)
    lines += ["", 'Failures (docs/trainer.md, "Failures"):', ""]
    lines += [
        f"- {md_text(s.stage)}: {_failure_line(t)}" for s, t in zip(stages, totals, strict=True)
    ]
    if any(extras):
        lines += ["", "KL to the reference (last step) and the GenRM judge:", ""]
        lines += [
            f"- {md_text(s.stage)}: {_kl_judge_line(e)}"
            for s, e in zip(stages, extras, strict=True)
            if e
        ]
    if stages:
        plots.append(plot_heldout(stages, folder.plots / "heldout.png"))
    if len(envs) > 1:
        plots.append(plot_heldout_by_env(stages, envs, folder.plots / "heldout_by_env.png"))
    lines += ["", *[f"![{md_text(p.stem)}]({p.relative_to(run_dir)})" for p in plots]]
    folder.report_json.write_text(
        json.dumps(
            {
                "stages": [
                    {**asdict(s), "failures": asdict(t), **e}
                    for s, t, e in zip(stages, totals, extras, strict=True)
                ],
                **(sections.data if sections is not None else {}),
            },
            indent=2,
        )
        + "\n"
    )
    report = folder.report_md
    report.write_text("\n".join(lines) + "\n")
    return report


TOOL_CALL_DETAILS = ("hallucination_rate", "valid_call_rate")
"""Held-out shares of multi-turn trajectories (docs/trainer.md "DPO")."""


def _tool_call_lines(stages: list[StageResult]) -> list[str]:
    """A table of the held-out tool-call rates of the stages that measured them."""
    measured = [
        s
        for s in stages
        if any(k in d for d in s.heldout_details.values() for k in TOOL_CALL_DETAILS)
    ]
    if not measured:
        return []
    lines = [
        "",
        'Held-out tool calls (before → after; docs/trainer.md, "DPO"):',
        "",
        "| stage | " + " | ".join(TOOL_CALL_DETAILS) + " |",
        "| --- |" + " ---: |" * len(TOOL_CALL_DETAILS),
    ]
    for s in measured:
        before, after = s.heldout_details.get("before", {}), s.heldout_details.get("after", {})
        cells = [_env_cell(before.get(k), after.get(k)) for k in TOOL_CALL_DETAILS]
        lines.append(f"| {md_text(s.stage)} | " + " | ".join(cells) + " |")
    return lines


def _kl_judge_line(extra: dict[str, float]) -> str:
    parts = []
    if "kl_last" in extra:
        parts.append(f"KL {extra['kl_last']:.3g}")
    if "genrm_comparisons" in extra:
        parts.append(
            f"{extra['genrm_comparisons']:.0f} judge comparisons, "
            f"{extra['genrm_comparisons_per_s']:.2f} comparisons/s"
        )
    return "; ".join(parts)


def _env_cell(before: float | None, after: float | None) -> str:
    cell = f"{_cell(before)} → {_cell(after)}"
    if before is not None and after is not None:
        cell += f" ({after - before:+.2f})"
    return cell


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _failure_line(t: FailureTotals) -> str:
    if not t.any():
        return "no failures"
    return (
        f"{_n(t.groups, 'group')} dropped ({_n(t.samples, 'sample')} failed), "
        f"{_n(t.retries, 'retry', 'retries')}, {_n(t.failing_steps, 'failing step')}; "
        f"held-out: {_n(t.heldout_failed_prompts, 'prompt')} left out "
        f"({_n(t.heldout_failed_samples, 'sample')} without a reward)"
    )


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"
