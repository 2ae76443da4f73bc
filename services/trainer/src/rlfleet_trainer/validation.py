"""Held-out reward: `validate` scores the first `grpo.num_val_prompts` held-out prompts,
and `heldout.json` keeps the start and end measures of a stage.

A held-out prompt whose Generate or ScoreGroup still fails after the clients' retries, or
whose every sample failed to score, is counted and left out; a sample whose reward failed
is left out of its prompt's mean (no group baseline here). More failed prompts than
`grpo.max_failed_group_fraction` of the prompts stop the run (TooManyFailures), so a
reward outage never passes for a measured reward.

Prompts of multi-turn environments (`multi_turn.envs`) run through the agent loop, as in
training; their held-out text is the whole exchange after the prompt, and their details
add `hallucination_rate` and `valid_call_rate` (agent.calls: share of the trajectories
with a hallucinated call; with at least one call and none hallucinated).

With `generation.seed` set, held-out prompt i's sample k draws seed
`generation.seed + VAL_SEED_OFFSET + i × val_samples_per_prompt + k` at every measure: the
start and end measures sample with common random numbers, so their paired difference
carries the policy's change rather than the sampler's luck (and a rerun reads the same
start measure, as far as the engine's batching lets its numerics repeat).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from rlfleet_contracts.reward_client import GroupScores, Score
from rlfleet_contracts.run_folder import StageFolder
from rlfleet_core.calls import CallFailed
from rlfleet_proto.v1 import rollout_pb2

from rlfleet_trainer.agent.calls import hallucination_rate, trajectory_verdict
from rlfleet_trainer.agent.rollout import AgentRollout, build_agent
from rlfleet_trainer.algorithms import REWARD_TIE
from rlfleet_trainer.clients import Sampling
from rlfleet_trainer.collector import TooManyFailures
from rlfleet_trainer.context import RunContext
from rlfleet_trainer.data import Prompt
from rlfleet_trainer.env_metrics import FULL_REWARD

logger = logging.getLogger(__name__)

VAL_SEED_OFFSET = 1 << 40
"""Held-out seeds start here, clear of the training stream's `seed + i × group size`."""


@dataclass
class Validation:
    """What one validation measured."""

    rewards: dict[str, float] = field(default_factory=dict)
    """`reward` (mean over scored prompts) and `reward/<env>`; empty without held-out data."""
    failed_prompts: int = 0
    failed_samples: int = 0
    """Samples without a reward, those of failed prompts included."""
    details: dict[str, float] = field(default_factory=dict)
    """`accuracy` and per environment `<env>/accuracy`, `<env>/gen_tokens_per_sample/mean`,
    `<env>/num_prompts` (NeMo-RL's names; accuracy = share of samples at full reward);
    multi-turn prompts add `hallucination_rate`, `valid_call_rate` (overall and per env)."""

    @property
    def metrics(self) -> dict[str, float]:
        if not self.rewards:
            return {}
        return {
            **self.rewards,
            **self.details,
            "failed_prompts": float(self.failed_prompts),
            "failed_samples": float(self.failed_samples),
        }


@dataclass
class _PromptResult:
    env: str
    reward: float | None
    """Mean over the prompt's scored samples; None when none was scored."""
    failed_samples: int
    accuracy: float = 0.0
    """Share of the scored samples at full reward."""
    gen_tokens: float = 0.0
    """Mean generated tokens of the prompt's samples."""
    tool_calls: list[dict[str, int]] | None = None
    """Multi-turn: each scored trajectory's calls by outcome (agent.calls)."""


async def validate(ctx: RunContext, label: str | None = None) -> Validation:
    """Reward over the first num_val_prompts held-out prompts (val_samples_per_prompt
    samples each at val_temperature). With `label`, every sample (text, reward or failure,
    weight version) goes to the stage folder's held-out samples file for that label, to
    read what the numbers are made of."""
    if ctx.val_source is None:
        return Validation()
    val_source, g = ctx.val_source, ctx.recipe.grpo
    sampling = Sampling.from_generation(ctx.recipe.generation, g.val_temperature)
    count = min(g.num_val_prompts, len(val_source.rows))
    tag = label or "val"
    samples: list[dict[str, Any]] = []

    agent = build_agent(ctx.recipe, ctx.rollout, ctx.reward, ctx.tokenizer)

    async def one(index: int) -> _PromptResult:
        prompt = val_source.prompt_at(index)
        n = g.val_samples_per_prompt
        calls: list[dict[str, int]] | None = None
        mine = sampling.for_group(index, n, prompt.max_tokens, offset=VAL_SEED_OFFSET)
        try:
            if agent is not None and agent.handles(prompt.env):
                results, texts, group, calls = await _multi_turn(
                    agent, replace(prompt, prompt_id=f"{tag}-{index}"), n, mine
                )
            else:
                results = await ctx.rollout.generate(f"{tag}-{index}", prompt.token_ids, n, mine)
                texts = [
                    ctx.tokenizer.decode(list(r.token_ids), skip_special_tokens=True)
                    for r in results
                ]
                group = await ctx.reward.score_samples(
                    f"{tag}-{index}",
                    prompt.env,
                    prompt.row_json,
                    texts,
                    [len(r.token_ids) for r in results],
                )
        except CallFailed as exc:
            logger.warning("held-out prompt %d failed: %s", index, exc)
            return _PromptResult(prompt.env, None, n)
        samples.extend(_sample_lines(index, prompt.env, texts, group, results, calls))
        scored = [s.reward for s in group.scores if s is not None]
        if group.failed_samples:
            logger.warning(
                "held-out prompt %d: %d of %d samples without a reward: %s",
                index,
                group.failed_samples,
                n,
                group.problem,
            )
        mean = sum(scored) / len(scored) if scored else None
        accuracy = sum(r >= FULL_REWARD - REWARD_TIE for r in scored) / max(len(scored), 1)
        tokens = sum(len(r.token_ids) for r in results) / max(len(results), 1)
        return _PromptResult(prompt.env, mean, group.failed_samples, accuracy, tokens, calls)

    results = await asyncio.gather(*(one(i) for i in range(count)))
    if label is not None:
        samples.sort(key=lambda s: s["prompt"])
        lines = "".join(json.dumps(s) + "\n" for s in samples)
        ctx.folder.heldout_samples(label).write_text(lines, encoding="utf-8")
    return _summarise(results, g.max_failed_group_fraction, tag)


async def _multi_turn(
    agent: AgentRollout, prompt: Prompt, n: int, sampling: Sampling
) -> tuple[list[rollout_pb2.GenerateResult], list[str], GroupScores, list[dict[str, int]]]:
    """A multi-turn prompt's held-out samples in the single-turn shapes: per trajectory its
    model tokens (and newest turn's version), the whole exchange as text, its score; and
    its calls by outcome."""
    trajectories = await agent.group(prompt, n, sampling)
    results = [
        rollout_pb2.GenerateResult(
            token_ids=[t for t, m in zip(tr.token_ids, tr.loss_mask or [], strict=True) if m],
            weight_version_last=max(tr.turn_weight_versions, default=0),
        )
        for tr in trajectories
    ]
    texts = [agent.decode(tr.token_ids) for tr in trajectories]
    scores: list[Score | None] = [Score(tr.reward, tr.reward_masked) for tr in trajectories]
    return results, texts, GroupScores(scores), [tr.tool_calls for tr in trajectories]


def _sample_lines(
    index: int,
    env: str,
    texts: list[str],
    group: GroupScores,
    results: list[Any],
    calls: list[dict[str, int]] | None,
) -> list[dict[str, Any]]:
    lines = [
        {
            "prompt": index,
            "env": env,
            "text": text,
            "reward": None if score is None else score.reward,
            **({"failure": group.problem} if score is None else {}),
            "weight_version": result.weight_version_last,
        }
        for text, score, result in zip(texts, group.scores, results, strict=True)
    ]
    for line, counts in zip(lines, calls or [], strict=False):
        line.update(verdict=trajectory_verdict(counts), tool_calls=counts)
    return lines


def _summarise(results: list[_PromptResult], fraction: float, tag: str) -> Validation:
    failed = sum(r.reward is None for r in results)
    allowed = math.floor(fraction * len(results) + 1e-9)
    if failed > allowed:
        raise TooManyFailures(
            f"validation ({tag}): {failed} of {len(results)} held-out prompts failed > "
            f"grpo.max_failed_group_fraction ({fraction}) allows {allowed}; check the "
            "rollout and reward services (trainer log), or raise that setting"
        )
    by_env: dict[str, list[float]] = {}
    for r in results:
        if r.reward is not None:
            by_env.setdefault(r.env, []).append(r.reward)
    scored = [reward for rewards in by_env.values() for reward in rewards]
    rewards = {"reward": sum(scored) / max(len(scored), 1)}
    rewards.update({f"reward/{env}": sum(v) / len(v) for env, v in sorted(by_env.items())})
    return Validation(rewards, failed, sum(r.failed_samples for r in results), _details(results))


def _details(results: list[_PromptResult]) -> dict[str, float]:
    scored = [r for r in results if r.reward is not None]
    if not scored:
        return {}
    details = {"accuracy": sum(r.accuracy for r in scored) / len(scored)}
    for env in sorted({r.env for r in scored}):
        mine = [r for r in scored if r.env == env]
        details[f"{env}/accuracy"] = sum(r.accuracy for r in mine) / len(mine)
        details[f"{env}/gen_tokens_per_sample/mean"] = sum(r.gen_tokens for r in mine) / len(mine)
        details[f"{env}/num_prompts"] = float(len(mine))
        details.update(_call_rates(mine, f"{env}/"))
    details.update(_call_rates(scored, ""))
    return details


def _call_rates(results: list[_PromptResult], prefix: str) -> dict[str, float]:
    """`hallucination_rate` and `valid_call_rate` over the multi-turn trajectories of
    `results` (agent.calls); {} when none is multi-turn."""
    calls = [c for r in results for c in (r.tool_calls or [])]
    if not calls:
        return {}
    valid = sum(trajectory_verdict(c) == "correct" for c in calls) / len(calls)
    return {
        f"{prefix}hallucination_rate": hallucination_rate(calls),
        f"{prefix}valid_call_rate": valid,
    }


def read_heldout(folder: StageFolder) -> dict[str, Any]:
    path = folder.heldout
    return json.loads(path.read_text()) if path.exists() else {}


def write_heldout(folder: StageFolder, when: str, result: Validation) -> None:
    """The held-out file = {"before": {...}, "after": {...}, "failures": {"before": {...},
    ...}, "details": {"before": {accuracy, <env>/accuracy, ...}, ...}}, replaced atomically. Failure counts sit apart from the rewards, whose every
    key but `reward` the pipeline's report reads as an environment."""
    data: dict[str, Any] = {**read_heldout(folder), when: result.rewards}
    data["details"] = {**data.get("details", {}), when: result.details}
    data["failures"] = {
        **data.get("failures", {}),
        when: {"failed_prompts": result.failed_prompts, "failed_samples": result.failed_samples},
    }
    tmp = folder.heldout.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(folder.heldout)
    logger.info(
        "held-out reward %s: %.3f (%d prompts failed)",
        when,
        result.rewards.get("reward", float("nan")),
        result.failed_prompts,
    )
