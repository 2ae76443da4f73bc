"""`rlfleet run --dry-run`: every stage of a pipeline as it would run under a launcher
profile, without starting anything: its recipe summary, starting model, blend, the
fleet's services at that stage (local) and the launch plan (`rlfleet rl --dry-run`'s, per
stage: processes, compose commands or a SLURM batch script).

No checks of the machine are run: the stages after the first start from exports that do
not exist yet. `rlfleet rl <kind> -c <recipe> --dry-run` checks one stage.
"""

from __future__ import annotations

from pathlib import Path

from rlfleet_contracts.run_folder import PipelineFolder

from rlfleet_pipeline.launch.profiles import Profile
from rlfleet_pipeline.launcher import PlannedStage
from rlfleet_pipeline.launchers import launcher_for
from rlfleet_pipeline.pipeline import RunSpec, data_dir, pipeline_of, stage_recipe
from rlfleet_pipeline.pipeline_end import REGRESSION_SERVICES, EndMeasures
from rlfleet_pipeline.stage import summary
from rlfleet_pipeline.stage_plan import pipeline_fleet


def pipeline_plan(out: Path, spec: RunSpec, profile: Profile) -> str:
    pipeline = pipeline_of(spec)
    recipes = [
        stage_recipe(pipeline, i, out, data_dir(out, s), spec.overrides)
        for i, s in enumerate(pipeline.stages)
    ]
    end = EndMeasures(out, pipeline)
    regression = [s.name for s in end.regression_stages()]
    rollout = pipeline.rollout_settings(spec.engine, recipes)
    fleet = pipeline_fleet(recipes, spec.engine, rollout, REGRESSION_SERVICES if regression else ())
    launcher = launcher_for(profile)
    lines = [
        f"# pipeline {pipeline.name}: {' -> '.join(pipeline.names())} "
        f"(run folder {out}, {launcher.kind} launcher)",
        f"# starting model {pipeline.model}; each later stage starts from the one before's "
        "export (<out>/stages/<stage>/hf)",
        "# no checks of this machine are run (later stages start from exports not made yet); "
        "`rlfleet rl <kind> -c <recipe> --dry-run` checks one stage",
    ]
    lines += launcher.pipeline_notes(rollout)
    for index, (stage, recipe) in enumerate(zip(pipeline.stages, recipes, strict=True)):
        stage_dir = PipelineFolder(out).stage(stage.name).root
        lines += ["", f"## stage {index + 1}/{len(recipes)}: {stage.name}", ""]
        lines += [f"#   {key}: {value}" for key, value in summary(recipe)]
        lines += [
            f"#   recipe: {stage.recipe} (+ {' '.join(stage.overrides) or 'no pipeline overrides'})",
            f"#   blend: {stage.blend} -> {data_dir(out, stage)}",
            f"#   starts from: {recipe.policy.model}",
        ]
        recipe_file = PipelineFolder(out).stage(stage.name).recipe_yaml
        lines += launcher.pipeline_stage_plan(
            PlannedStage(recipe, stage_dir, recipe_file, spec.engine, fleet[index], pipeline.model)
        )
        if stage.name in regression:
            lines.append(
                f"#   measured again at the end on the final weights ({stage.name} held-out)"
            )
    if regression:
        lines += [
            "",
            "## end of run",
            f"# rlfleet-trainer eval --model <{pipeline.stages[-1].name} export> "
            f"--out {PipelineFolder(out).regression} "
            + " ".join(f"-c <{name} recipe>" for name in regression),
        ]
    return "\n".join(lines) + "\n"
