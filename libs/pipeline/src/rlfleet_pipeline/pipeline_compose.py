"""`rlfleet run --run compose`: a pipeline's stages against the container stack of
deploy/compose/compose.yaml, with the same run folder, resume, measures and report as the
local run (rlfleet_pipeline.pipeline).

The rollout container serves the pipeline's starting model (a bundled one: a container
cannot read this host's exports) for the whole run, and each stage's trainer (on this
host) publishes its own starting weights to it over gRPC before its first sample. Each
stage brings up what it needs with `docker compose up --wait` (compose recreates only the
containers whose settings changed: the reward gateway when a stage gives it a judge or
episode limits); the project comes down at the end, or on an error or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from rlfleet_contracts.run_folder import PipelineFolder
from rlfleet_core.auth import TOKEN_FILE_ENV
from rlfleet_core.models import BUNDLED_MODELS

from rlfleet_pipeline.launch.compose import (
    ROLLOUT_MODEL_VAR,
    ComposeError,
    ensure_token_file,
    token_file_for,
)
from rlfleet_pipeline.launch.profiles import ComposeProfile
from rlfleet_pipeline.lineage import write_lineage
from rlfleet_pipeline.pipeline import (
    PipelineError,
    RunSpec,
    lineage_extra,
    prepare_data,
    read_walls,
    run_stage,
    stage_done,
    stage_index,
    stage_path,
    stage_recipe,
    stage_result,
    start_run,
)
from rlfleet_pipeline.pipeline_end import EndMeasures
from rlfleet_pipeline.report import write_report
from rlfleet_pipeline.report_sections import end_of_run_sections
from rlfleet_pipeline.stage import compose_env, compose_stack
from rlfleet_pipeline.stage_plan import local_services

COMPOSE_TRANSPORT = "services.weight_transport=grpc_stream"
"""The only weight transport that reaches a container from this host."""


def run_pipeline_compose(
    out: Path,
    spec: RunSpec,
    profile: ComposeProfile,
    *,
    resume: bool,
    until: str | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    spec, pipeline = start_run(out, spec, resume)
    if pipeline.model not in BUNDLED_MODELS:
        raise PipelineError(
            f"--model {pipeline.model}: the rollout container serves a bundled model "
            f"({', '.join(BUNDLED_MODELS)}); use --run local for another"
        )
    last = stage_index(pipeline, until, "--to") if until is not None else len(pipeline.stages) - 1
    data = prepare_data(pipeline, out)
    overrides = [*spec.overrides, COMPOSE_TRANSPORT]
    recipes = [
        stage_recipe(pipeline, i, out, data[s.name], overrides)
        for i, s in enumerate(pipeline.stages)
    ]
    walls = read_walls(out)
    end = EndMeasures(out, pipeline)
    at_end = last == len(pipeline.stages) - 1
    token_file = token_file_for(out, os.environ)
    env = {**os.environ, TOKEN_FILE_ENV: str(token_file)}
    saved = os.environ.get(TOKEN_FILE_ENV)
    os.environ[TOKEN_FILE_ENV] = str(token_file)  # the trainer and eval inherit it
    stack = None
    try:
        ensure_token_file(token_file, env)
        for index in range(last + 1):
            stage, recipe = pipeline.stages[index], recipes[index]
            stage_dir = stage_path(out, stage)
            train = not stage_done(stage_dir)
            if not train and not end.win_rate_due(stage):
                continue
            served = recipe.model_copy(
                update={"policy": recipe.policy.model_copy(update={"model": pipeline.model})}
            )
            stage_env = {**env, **compose_env(served, spec.engine)}
            stack = compose_stack(profile, stage_env)
            services = local_services(recipe)
            stack.check_docker()
            stack.check_images(services)
            started = time.monotonic()
            say(f"{stage.name}: compose up {', '.join(services)} ({stage_env[ROLLOUT_MODEL_VAR]})")
            stack.up(services, profile.wait_timeout_s)
            say(f"{stage.name}: services healthy after {time.monotonic() - started:.0f} s")
            targets = {"rollout": stack.target("rollout"), "reward": stack.target("reward")}
            if train:
                started = time.monotonic()
                stage_dir.mkdir(parents=True, exist_ok=True)
                write_lineage(
                    stage_dir.resolve(), recipe, stage.recipe, **lineage_extra(pipeline, index)
                )
                resuming = resume and (stage_dir / "checkpoints").exists()
                run_stage(stage_dir, recipe, targets, resuming, lambda rows, phase: None)
                walls[stage.name] = walls.get(stage.name, 0.0) + time.monotonic() - started
                PipelineFolder(out).walls.write_text(json.dumps(walls, indent=2) + "\n")
                say(f"{stage.name}: trained in {walls[stage.name]:.0f} s")
            if end.win_rate_due(stage):
                rate = end.run_win_rate(stage, targets)
                say(f"{stage.name}: GenRM win rate vs its start {rate['win_rate']:.3f}")
        if at_end and end.regression_due() and stack is not None:
            needed = ["sandbox", "reward", "rollout"]
            stack.up(needed, profile.wait_timeout_s)
            say("measuring the final weights on earlier stages' held-out sets ...")
            end.run_regression(
                {"rollout": stack.target("rollout"), "reward": stack.target("reward")}
            )
    finally:
        if saved is None:
            os.environ.pop(TOKEN_FILE_ENV, None)
        else:
            os.environ[TOKEN_FILE_ENV] = saved
        if stack is not None:
            try:
                stack.save_logs(PipelineFolder(out).logs / "compose.log")
                stack.down()
            except (ComposeError, OSError) as exc:
                say(f"could not save the logs or bring the project down: {exc}")
    done = [stage_done(stage_path(out, s)) for s in pipeline.stages]
    shown = [s for i, s in enumerate(pipeline.stages) if i <= last or done[i]]
    results = [stage_result(s, stage_path(out, s), walls.get(s.name, 0.0)) for s in shown]
    return write_report(out, results, end_of_run_sections(out, results))
