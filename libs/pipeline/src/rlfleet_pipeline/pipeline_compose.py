"""`rlfleet run --run compose`: a pipeline's stages against the container stack of
deploy/compose/compose.yaml, with the same run folder, resume, measures and report as the
local run (rlfleet_pipeline.pipeline).

What runs where: the services are containers of one compose project (the profile's
project_name): sandbox, reward, rollout, the swe-runner (which starts each SWE episode's
instance container through the host's Docker socket) and, for a judged stage, the judge
(a second rollout container, profile `judge`). Each stage's trainer and the end-of-run
`rlfleet-trainer eval` runs are processes on this host, against the ports compose
publishes on 127.0.0.1, with the run's fleet token (<out>/auth_token unless
RLFLEET_AUTH_TOKEN_FILE names one).

The rollout container serves the pipeline's starting model (a bundled one: a container
cannot read this host's exports) for the whole run, with the pipeline's rollout settings
(ROLLOUT_OVERRIDES), and each stage's trainer publishes its own starting weights to it
over gRPC (`grpc_stream`) before its first sample. Each stage brings up what it needs with
`docker compose up --wait` (compose recreates only the containers whose settings changed:
the reward gateway when a stage gives it other targets, a judge or episode limits); a
service an earlier stage started stays up until the end. The project comes down at the
end, or on an error or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.run_folder import PipelineFolder
from rlfleet_core.auth import TOKEN_FILE_ENV
from rlfleet_core.models import BUNDLED_MODELS

from rlfleet_pipeline.launch.compose import (
    JUDGE_PROFILE,
    OVERRIDES_VARS,
    ROLLOUT_MODEL_VAR,
    ComposeError,
    ComposeStack,
    ensure_token_file,
    reward_target_env,
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
    run_results,
    run_stage,
    stage_done,
    stage_index,
    stage_path,
    stage_recipe,
    start_run,
)
from rlfleet_pipeline.pipeline_end import REGRESSION_SERVICES, EndMeasures
from rlfleet_pipeline.pipelines import Pipeline
from rlfleet_pipeline.preflight import ensure_swe_images
from rlfleet_pipeline.report import write_report
from rlfleet_pipeline.report_sections import end_of_run_sections
from rlfleet_pipeline.stage import compose_env, compose_model_problem, compose_stack
from rlfleet_pipeline.stage_plan import local_services

COMPOSE_TRANSPORT = "services.weight_transport=grpc_stream"
"""The only weight transport that reaches a container from this host."""
"""What the end-of-run regression eval needs (the earlier stages' single-turn sets)."""


def served_recipe(recipe: RecipeConfig, pipeline: Pipeline) -> RecipeConfig:
    """The stage's recipe as the containers see it: the rollout serves the pipeline's
    (bundled) starting model, whatever export the stage's trainer starts from."""
    policy = recipe.policy.model_copy(update={"model": pipeline.model})
    return recipe.model_copy(update={"policy": policy})


def stage_compose_env(
    recipe: RecipeConfig,
    pipeline: Pipeline,
    engine: str,
    base: Mapping[str, str],
    rollout: list[str],
) -> dict[str, str]:
    """compose.yaml's variables for one stage of the pipeline: the stage's own (compose_env)
    and the pipeline's rollout settings (`rollout`: Pipeline.shared_rollout), the same for
    every stage so that the rollout container is never recreated between stages."""
    return {
        **base,
        **compose_env(served_recipe(recipe, pipeline), engine),
        OVERRIDES_VARS["rollout"]: json.dumps(rollout),
    }


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
    for recipe in recipes[: last + 1]:  # a judge model the judge container cannot serve
        problem = compose_model_problem(served_recipe(recipe, pipeline))
        if problem is not None:
            raise PipelineError(f"stage {recipe.stage}: {problem}")
    pending = [
        r
        for i, r in enumerate(recipes[: last + 1])
        if not stage_done(stage_path(out, pipeline.stages[i]))
    ]
    try:
        ensure_swe_images(pending, say)  # the swe-runner container starts them
    except ValueError as exc:
        raise PipelineError(str(exc)) from None
    walls = read_walls(out)
    end = EndMeasures(out, pipeline)
    at_end = last == len(pipeline.stages) - 1
    rollout = pipeline.shared_rollout(recipes)
    token_file = token_file_for(out, os.environ)
    env = {**os.environ, TOKEN_FILE_ENV: str(token_file)}
    saved = os.environ.get(TOKEN_FILE_ENV)
    os.environ[TOKEN_FILE_ENV] = str(token_file)  # the trainer and eval inherit it
    # ps, logs and down see every service of the project, the judge's profile included.
    project = compose_stack(profile, {**env, "COMPOSE_PROFILES": JUDGE_PROFILE})
    started_any = False
    try:
        ensure_token_file(token_file, env)
        project.check_docker()
        for index in range(last + 1):
            stage, recipe = pipeline.stages[index], recipes[index]
            stage_dir = stage_path(out, stage)
            train = not stage_done(stage_dir)
            if not train and not end.win_rate_due(stage):
                continue
            stage_env = stage_compose_env(recipe, pipeline, spec.engine, env, rollout)
            stack = compose_stack(profile, stage_env)
            started_any = True
            targets = _up(stack, local_services(recipe), profile, stage.name, say)
            if train:
                started = time.monotonic()
                stage_dir.mkdir(parents=True, exist_ok=True)
                write_lineage(
                    stage_dir.resolve(), recipe, stage.recipe, **lineage_extra(pipeline, index)
                )
                resuming = resume and (stage_dir / "checkpoints").exists()
                say(f"{stage.name}: training ({stage_dir})")
                run_stage(stage_dir, recipe, targets, resuming, lambda rows, phase: None)
                walls[stage.name] = walls.get(stage.name, 0.0) + time.monotonic() - started
                PipelineFolder(out).walls.write_text(json.dumps(walls, indent=2) + "\n")
                say(f"{stage.name}: trained in {walls[stage.name]:.0f} s")
            if end.win_rate_due(stage):
                say(f"{stage.name}: judging its held-out answers against its start ...")
                rate = end.run_win_rate(stage, targets)
                say(
                    f"{stage.name}: GenRM win rate vs its start {rate['win_rate']:.3f} "
                    f"over {rate['pairs']:.0f} pairs"
                )
        if at_end and end.regression_due():
            # The gateway again with a sandbox (a stage without one set its target empty).
            final_env = {
                **stage_compose_env(recipes[-1], pipeline, spec.engine, env, rollout),
                **reward_target_env(REGRESSION_SERVICES),
            }
            stack = compose_stack(profile, final_env)
            started_any = True
            targets = _up(stack, list(REGRESSION_SERVICES), profile, "regression", say)
            say("measuring the final weights on earlier stages' held-out sets ...")
            end.run_regression(targets)
    finally:
        if saved is None:
            os.environ.pop(TOKEN_FILE_ENV, None)
        else:
            os.environ[TOKEN_FILE_ENV] = saved
        if started_any:
            _down(project, PipelineFolder(out).logs / "compose.log", say)
    if not at_end and until is not None:
        say(
            f"stopped after {until} (--to); continue with `rlfleet run --run compose --resume --out {out}`"
        )
    results = run_results(out, pipeline, last, walls)
    return write_report(out, results, end_of_run_sections(out, results))


def _up(
    stack: ComposeStack,
    services: list[str],
    profile: ComposeProfile,
    name: str,
    say: Callable[[str], None],
) -> dict[str, str]:
    """`up --wait` the services (unchanged running ones are kept); the trainer's targets."""
    stack.check_images(services)
    started = time.monotonic()
    say(f"{name}: compose up {', '.join(services)} ({stack.env[ROLLOUT_MODEL_VAR]})")
    stack.up(services, profile.wait_timeout_s)
    say(f"{name}: services healthy after {time.monotonic() - started:.0f} s")
    return {"rollout": stack.target("rollout"), "reward": stack.target("reward")}


def _down(project: ComposeStack, log_path: Path, say: Callable[[str], None]) -> None:
    """Save every container's log, then bring the whole project down."""
    started = time.monotonic()
    try:
        project.save_logs(log_path)
    except (ComposeError, OSError) as exc:
        say(f"could not save the containers' logs: {exc}")
    try:
        project.down()
        say(f"compose project {project.project} down in {time.monotonic() - started:.0f} s")
    except ComposeError as exc:
        say(f"could not bring the project down: {exc}")
