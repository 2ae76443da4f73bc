"""What a stage needs: its kind, environments and services, and what each service is given
(the rollout's model, the reward gateway's judge and episode settings, the judge's
model). Shared by every launcher (local fleet, compose, SLURM) and the dry-run checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_core.config import format_override, format_value
from rlfleet_core.override_values import quote_value

from rlfleet_pipeline.fleet import START_ORDER


class StageError(ValueError):
    pass


SERVICES_FOR_STAGE = {
    "rlvr": ["sandbox", "reward", "rollout"],
    "grpo": ["sandbox", "reward", "rollout"],
    "rlhf": ["reward", "rollout"],
    # DPO pairs come from the policy's own tool-use episodes (rlfleet_trainer.dpo_stage).
    "dpo": ["reward", "rollout"],
}
SWE_ENV_SERVICES = {"swe_pivot": (), "swe_agent": ("swe-runner",)}
"""What a swe stage's environments need beyond reward + rollout: swe_pivot compares tool
calls (no container), swe_agent runs sessions in the swe-runner. Any other environment
of a swe stage gets the sandbox (the code environments need it)."""
SERVICE_ORDER = ("sandbox", "reward", "rollout", "swe-runner")


def stage_envs(recipe: RecipeConfig) -> list[str]:
    """The environments a recipe names: its multi-turn envs and blend weights, and
    data.default_env for a single-turn stage (a multi-turn stage's rows name their env)."""
    named = [*recipe.multi_turn.envs, *recipe.data.env_weights]
    if not recipe.multi_turn.envs:
        named.append(recipe.data.default_env)
    return list(dict.fromkeys(named))


def stage_services(recipe: RecipeConfig) -> list[str]:
    """The services the recipe's stage needs: by its kind (RecipeConfig.kind); a swe
    stage's from what its environments need (SWE_ENV_SERVICES)."""
    kind = recipe.kind
    if kind != "swe":
        return SERVICES_FOR_STAGE[kind]
    needed = {"reward", "rollout"}
    for env in stage_envs(recipe):
        needed.update(SWE_ENV_SERVICES.get(env, ("sandbox",)))
    return [s for s in SERVICE_ORDER if s in needed]


def local_services(recipe: RecipeConfig) -> list[str]:
    """What the local fleet and compose start: stage_services, plus `judge` (a second
    rollout service serving `judge.model`) when the recipe serves its judge beside the
    stage. SLURM starts none: give `judge.base_url` there."""
    return [*stage_services(recipe), *(["judge"] if recipe.judge.served else [])]


def judge_overrides(recipe: RecipeConfig, engine: str) -> dict[str, list[str]]:
    """The reward gateway's `judge.*` / `genrm.*` from the recipe's `judge` section, and the
    judge rollout's engine, model and context when the stage serves it (the fleet adds
    `judge.base_url` for that one: `fleet.wiring`)."""
    j = recipe.judge
    if not j.configured:
        return {}
    reward = [
        f"judge.temperature={j.temperature:g}",
        f"judge.top_p={j.top_p:g}",
        f"judge.max_tokens={j.max_tokens}",
        f"judge.request_timeout_s={j.request_timeout_s:g}",
        f"judge.prefill={'true' if j.prefill else 'false'}",
        *(f"genrm.{key}={format_value(value)}" for key, value in j.genrm.items()),
    ]
    if not j.served:
        reward.append(f"judge.base_url={j.base_url}")
        reward += [f"judge.model={j.model}"] if j.model else []
        reward += [f"judge.api_key_env={j.api_key_env}"] if j.api_key_env else []
        return {"reward": reward}
    judge = [f"engine={j.engine or engine}", f"model={j.model}"]
    if j.max_model_len is not None:
        judge.append(f"engine_config.max_model_len={j.max_model_len}")
    return {"reward": reward, "judge": judge}


ROLLOUT_ENGINES = ("vllm", "hf")
MAX_MODEL_LEN = "engine_config.max_model_len"


def rollout_overrides(recipe: RecipeConfig, engine: str) -> dict[str, list[str]]:
    """The rollout serves the policy's model (same weights and token ids as the trainer)
    at the recipe's sequence length; a stage with `swe_agent` episodes gives the reward
    gateway episode limits that fit them (swe_episode_overrides); a recipe's `judge`
    section gives the gateway its judge settings and the judge rollout its model
    (judge_overrides)."""
    if engine not in ROLLOUT_ENGINES:
        raise StageError(f"rollout engine {engine!r}: expected one of {', '.join(ROLLOUT_ENGINES)}")
    overrides = [
        f"engine={engine}",
        format_override("model", recipe.policy.model),
        # Serve the sequences the trainer trains (the rollout's own default is 1,024).
        f"{MAX_MODEL_LEN}={recipe.policy.max_total_sequence_length}",
    ]
    if recipe.services.weight_transport == "shared_file" and recipe.services.shared_dir:
        # The rollout loads shared-file updates only from folders it is told to trust.
        overrides.append(f"weight_file_roots=[{quote_value(recipe.services.shared_dir)}]")
    planned = {"rollout": overrides}
    if SWE_AGENT_ENV in recipe.multi_turn.envs:
        planned["reward"] = swe_episode_overrides(recipe)
    for service, extra in judge_overrides(recipe, engine).items():
        planned[service] = [*planned.get(service, []), *extra]
    return planned


SWE_AGENT_ENV = "swe_agent"


def swe_episode_overrides(recipe: RecipeConfig) -> list[str]:
    """The reward gateway's episode limits for `swe_agent`, from the trainer's per-call
    deadline (multi_turn.step_timeout_s, which also bounds CloseEpisode: the tests): each
    tool call and the verification end a few seconds inside it, so the gateway answers
    with a result rather than the trainer's deadline cutting it (the reward's caps: 600 s
    a call, 1800 s a verification). The runner's per-command limit (swe.command_timeout_s,
    300 s) and test limit (swe.test_timeout_s, 900 s) are lowered to fit."""
    inside = recipe.multi_turn.step_timeout_s - 5.0
    return [
        f"episodes.tool_timeout_s={min(600.0, inside):g}",
        f"episodes.close_timeout_s={min(1800.0, inside):g}",
        f"episodes.idle_timeout_s={max(600.0, recipe.multi_turn.max_trajectory_time_s):g}",
    ]


@dataclass(frozen=True)
class FleetPlan:
    """A stage's fleet, the same for every launcher: the services it starts (in start order)
    and what the stage gives each (`key=value` overrides of that service's config model; a
    launcher adds only its wiring, and preflight validates what each service is really
    given against the service's own model)."""

    services: list[str]
    settings: dict[str, list[str]] = field(default_factory=dict)

    def given(self, service: str) -> list[str]:
        """The stage's overrides of `service` (none: [])."""
        return list(self.settings.get(service, []))


def plan_fleet(recipe: RecipeConfig, engine: str, serve_judge: bool = True) -> FleetPlan:
    """The stage's fleet: stage_services, plus the judge's rollout where the recipe serves
    one and the launcher can (`serve_judge`: not SLURM, where `judge.base_url` names it),
    each given what rollout_overrides plans."""
    services = local_services(recipe) if serve_judge else stage_services(recipe)
    return FleetPlan(services, rollout_overrides(recipe, engine))


def pipeline_fleet(
    recipes: list[RecipeConfig],
    engine: str,
    rollout: list[str],
    end_services: tuple[str, ...] = (),
) -> list[FleetPlan]:
    """One fleet for a pipeline's stages: (services, overrides) per stage. A stage gets
    what it needs (local_services), keeps what it had that a later stage or the end of
    the run (`end_services`) still needs, and drops the rest (the swe-runner after the
    last swe stage); a service keeps its overrides while a stage that does not use it
    runs. The policy's rollout is given `rollout` for the whole run (its model is the
    pipeline's start; each stage's trainer publishes its own weights first)."""
    needs = [local_services(r) for r in recipes]
    plans: list[FleetPlan] = []
    running: list[str] = []
    overrides: dict[str, list[str]] = {}
    for index, recipe in enumerate(recipes):
        later = {s for need in needs[index + 1 :] for s in need} | set(end_services)
        running = [s for s in START_ORDER if s in needs[index] or (s in running and s in later)]
        planned = rollout_overrides(recipe, engine)
        planned["rollout"] = list(rollout)
        overrides = {
            s: planned.get(s, []) if s in needs[index] else overrides.get(s, []) for s in running
        }
        plans.append(FleetPlan(running, overrides))
    return plans
