"""The pipeline report's stage-kind sections: each stage's own measure of success, said
plainly when it did not move, and the end-of-run regression table.

- rlvr: held-out reward; swe1 (pivot): held-out share of demonstrated tool calls matched;
  swe2: held-out resolve rate (trajectories whose tests pass); rlhf: GenRM win rate of the
  stage's answers against its start's; dpo: held-out hallucination rate (lower is better).
  A change inside two standard errors (from the held-out samples, paired by prompt, or
  the win rate's pairs) is reported as noise, not as a gain or a loss.
- Regressions: for each earlier stage measured again at the end (pipeline_end), its
  held-out reward right after it trained and on the final weights.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, variance
from typing import Any

from rlfleet_contracts.run_folder import PipelineFolder

from rlfleet_pipeline.pipeline_end import REGRESSION_RESULTS, stage_kind
from rlfleet_pipeline.report import StageResult, md_text

MOVED = 1e-9
NOISE_SE = 2.0
"""A change smaller than this many standard errors is reported as noise."""


@dataclass
class Sections:
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    """Merged into report.json."""


def _detail(stage: StageResult, label: str, key: str) -> float | None:
    value = stage.heldout_details.get(label, {}).get(key)
    return None if value is None or not math.isfinite(value) else value


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


Scored = list[tuple[Any, float]]
"""(held-out prompt, reward) per scored sample of one validation."""


def _scored_samples(stage_dir: Path, label: str) -> Scored:
    """The scored held-out samples of one validation (heldout_<label>.jsonl)."""
    path = stage_dir / f"heldout_{label}.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [
        (r.get("prompt"), float(r["reward"]))
        for r in rows
        if isinstance(r.get("reward"), int | float)
    ]


def _per_prompt(samples: Scored) -> dict[Any, list[float]]:
    out: dict[Any, list[float]] = {}
    for prompt, reward in samples:
        out.setdefault(prompt, []).append(reward)
    return out


def _difference_se(before: Scored, after: Scored) -> float | None:
    """Standard error of mean(after) - mean(before). Paired by held-out prompt when both
    validations scored the same samples of the same prompts: the spread of the prompts'
    mean changes, so a prompt's samples do not count as independent draws and its
    difficulty cancels. Otherwise the two sets of samples are taken as independent."""
    by_before, by_after = _per_prompt(before), _per_prompt(after)
    paired = (
        None not in by_before
        and by_before.keys() == by_after.keys()
        and all(len(by_before[p]) == len(by_after[p]) for p in by_before)
    )
    if paired and len(by_before) >= 2:
        changes = [fmean(by_after[p]) - fmean(by_before[p]) for p in by_before]
        return math.sqrt(variance(changes) / len(changes))
    if len(before) < 2 or len(after) < 2:
        return None
    xs, ys = [r for _, r in before], [r for _, r in after]
    return math.sqrt(variance(xs) / len(xs) + variance(ys) / len(ys))


def stage_measure(stage: StageResult, kind: str, stage_dir: Path) -> dict[str, Any]:
    """{metric, before, after, better, se}: the stage kind's measure (module docstring);
    `se` is the standard error of after - before where the samples give one."""
    rewards = {label: _scored_samples(stage_dir, label) for label in ("before", "after")}
    if kind == "swe2":
        solved = {k: [(p, 1.0 if r >= 1.0 else 0.0) for p, r in v] for k, v in rewards.items()}
        return {
            "metric": "held-out resolve rate",
            "before": _detail(stage, "before", "accuracy"),
            "after": _detail(stage, "after", "accuracy"),
            "better": "higher",
            "se": _difference_se(solved["before"], solved["after"]),
        }
    if kind == "rlhf":
        path = stage_dir / "genrm_win_rate.json"
        rate = json.loads(path.read_text()) if path.is_file() else {}
        win = rate.get("win_rate")
        return {
            "metric": "GenRM win rate vs the stage's start",
            "before": 0.5,  # the start against itself
            "after": win if isinstance(win, float) and math.isfinite(win) else None,
            "better": "higher",
            "pairs": rate.get("pairs"),
            # Against 0.5 (no difference): a share of `pairs` coin flips.
            "se": 0.5 / math.sqrt(rate["pairs"]) if rate.get("pairs") else None,
        }
    if kind == "dpo":
        return {
            "metric": "held-out hallucination rate",
            "before": _detail(stage, "before", "hallucination_rate"),
            "after": _detail(stage, "after", "hallucination_rate"),
            "better": "lower",
            "se": None,
        }
    metric = "held-out demonstrated-call match" if kind == "swe1" else "held-out reward"
    return {
        "metric": metric,
        "before": _finite(stage.heldout_reward_before),
        "after": _finite(stage.heldout_reward_after),
        "better": "higher",
        "se": _difference_se(rewards["before"], rewards["after"]),
    }


def verdict(measure: dict[str, Any]) -> str:
    """ "improved" / "got worse" only beyond two standard errors of the difference (when
    the samples give one); "within noise" inside them; "did not move" for no change."""
    before, after = measure["before"], measure["after"]
    if before is None or after is None:
        return "not measured"
    if abs(after - before) <= MOVED:
        return "did not move"
    se = measure.get("se")
    if se is not None and abs(after - before) < NOISE_SE * se:
        return f"within noise (±{NOISE_SE * se:.2f})"
    improved = (after > before) == (measure["better"] == "higher")
    return "improved" if improved else "got worse"


def end_of_run_sections(out: Path, stages: list[StageResult]) -> Sections:
    """The sections for a pipeline folder's stages (in order; the last one made the
    final weights the regression table measures)."""
    folder = PipelineFolder(out)
    sections = Sections()
    measures = {}
    kinds = {
        s.stage: s.stage if s.stage in ("swe1", "swe2") else stage_kind(s.stage) for s in stages
    }
    lines = [
        "",
        "Each stage's own measure (before → after the stage):",
        "",
        "| stage | measure | before | after | outcome |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for stage in stages:
        measure = stage_measure(stage, kinds.get(stage.stage, ""), folder.stage(stage.stage).root)
        measures[stage.stage] = {**measure, "outcome": verdict(measure)}
        lines.append(
            f"| {md_text(stage.stage)} | {md_text(measure['metric'])} | "
            f"{_cell(measure['before'])} | "
            f"{_cell(measure['after'])} | {measures[stage.stage]['outcome']} |"
        )
    sections.lines += lines
    sections.data["measures"] = measures
    results_path = folder.regression / REGRESSION_RESULTS
    if results_path.is_file():
        final = json.loads(results_path.read_text())
        by_name = {s.stage: s for s in stages}
        rows = []
        for name, result in final.items():
            after_stage = by_name[name].heldout_reward_after if name in by_name else float("nan")
            at_end = float(result.get("reward", float("nan")))
            rows.append({"stage": name, "after_stage": after_stage, "at_end": at_end})
        sections.data["regression"] = rows
        sections.lines += [
            "",
            f"Regressions: the final weights ({md_text(stages[-1].stage)}'s export) on "
            f"earlier stages' held-out sets ({md_text(folder.regression.name)}/):",
            "",
            "| held-out set | after its stage | at the end | change |",
            "| --- | ---: | ---: | ---: |",
            *(
                f"| {md_text(r['stage'])} | {_cell(r['after_stage'])} | {_cell(r['at_end'])} | "
                f"{_delta(r['after_stage'], r['at_end'])} |"
                for r in rows
            ),
        ]
    return sections


def _cell(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _delta(before: float, after: float) -> str:
    if not (math.isfinite(before) and math.isfinite(after)):
        return "—"
    return f"{after - before:+.3f}"
