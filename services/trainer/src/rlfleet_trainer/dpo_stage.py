"""The DPO stage (`rlfleet rl dpo`, a recipe of kind `dpo`): preference
pairs sampled from the policy itself through the rollout and reward services, then DPO
on the GRPO backends.

1. The rollout serves the starting weights (published first when it serves others).
2. Held-out before (`validation.validate`: reward, `hallucination_rate`, `valid_call_rate`).
3. `dpo.samples_per_prompt` trajectories of each of the first `dpo.num_prompts` training
   prompts through the agent loop GRPO trains with, scored by the reward gateway's
   episodes; each gets a verdict (`agent.calls.trajectory_verdict`) and `dpo.pick_pairs`
   pairs them: chosen = every call valid (best reward first), rejected = a hallucinated
   call. A pair's tokens are the trajectories' own ids (never re-tokenized); the
   environment's tokens (tool results) are masked out of the loss.
4. `dpo.train_on_pairs` (`dpo.epochs` over `dpo.pairs_per_step` pairs a step), one line
   of metrics.jsonl per step; the pairs as text in pairs.jsonl.
5. The trained weights go to the rollout; held-out after; hf/ export; summary.json.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from rlfleet_contracts.preference import PreferencePair
from rlfleet_core.calls import CallFailed
from rlfleet_core.tracking import MetricsLogger

from rlfleet_trainer.agent.calls import trajectory_verdict
from rlfleet_trainer.agent.rollout import AgentRollout, build_agent
from rlfleet_trainer.batch import Trajectory
from rlfleet_trainer.checkpoint import TrainerState
from rlfleet_trainer.clients import Sampling
from rlfleet_trainer.collector import TooManyFailures
from rlfleet_trainer.context import RunContext
from rlfleet_trainer.data import Prompt, row_messages
from rlfleet_trainer.dpo import ScoredSample, TokenizedPair, pick_pairs, train_on_pairs
from rlfleet_trainer.loop import publish_weights, same_weights
from rlfleet_trainer.validation import read_heldout, validate, write_heldout

logger = logging.getLogger(__name__)


@dataclass
class SampledPairs:
    pairs: list[TokenizedPair]
    rows: list[dict[str, Any]]
    """The same pairs as preference rows (text, verdicts, rewards) for pairs.jsonl."""
    metrics: dict[str, float]
    """sampling/*: prompts, failed prompts, trajectories, verdict counts, pairs."""


async def run_dpo(ctx: RunContext, resume: bool = False) -> TrainerState:
    """The whole stage; returns its state (step = DPO optimizer steps)."""
    if resume:
        raise ValueError(
            "a dpo stage keeps no checkpoints: --resume cannot continue it; run it again"
        )
    recipe = ctx.recipe
    state = TrainerState()
    served, served_model = await ctx.rollout.served()
    if served != 0 or not same_weights(served_model, recipe.policy.model):
        state.weight_version = served + 1
        await publish_weights(ctx, state.weight_version)
    if recipe.grpo.val_at_start and "before" not in read_heldout(ctx.folder):
        write_heldout(ctx.folder, "before", await validate(ctx, "before"))
    sampled = await sample_pairs(ctx)
    ctx.folder.pairs.write_text("".join(json.dumps(row) + "\n" for row in sampled.rows))
    logger.info("%d pairs from %s", len(sampled.pairs), sampled.metrics)
    if not sampled.pairs:
        raise RuntimeError(
            f"dpo: no pair from {sampled.metrics['sampling/trajectories']:.0f} trajectories "
            f"({sampled.metrics}): no prompt had both a trajectory whose calls were all valid "
            "and one with a hallucinated call; raise dpo.samples_per_prompt or dpo.num_prompts"
        )
    steps = await asyncio.to_thread(
        train_on_pairs,
        ctx.backend,
        sampled.pairs,
        recipe.dpo,
        reference=recipe.dpo.reference,
        pairs_per_step=recipe.dpo.pairs_per_step,
        epochs=recipe.dpo.epochs,
        pad_token_id=ctx.tokenizer.pad_token_id or 0,
    )
    ctx.folder.metrics.write_text("")  # the stage's steps, written afresh
    with MetricsLogger(
        ctx.run_dir, recipe.logger, run_name=recipe.stage, jsonl=ctx.folder.metrics
    ) as out:
        for index, metrics in enumerate(steps, start=1):
            out.log(index, {**metrics, **(sampled.metrics if index == 1 else {})})
            logger.info("dpo step %d loss %.4f", index, metrics.get("loss", float("nan")))
    state.step = len(steps)
    state.last_metrics = {**steps[-1], **sampled.metrics}
    state.weight_version += 1
    await publish_weights(ctx, state.weight_version)
    if recipe.grpo.val_at_end:
        write_heldout(ctx.folder, "after", await validate(ctx, "after"))
    return state


async def sample_pairs(ctx: RunContext) -> SampledPairs:
    """K trajectories of each sampled training prompt, and the pairs they give."""
    recipe, d = ctx.recipe, ctx.recipe.dpo
    agent = build_agent(recipe, ctx.rollout, ctx.reward, ctx.tokenizer)
    if agent is None:
        raise ValueError(
            "a dpo stage samples tool-use trajectories: set multi_turn.envs (e.g. [tool_use])"
        )
    source = ctx.source
    count = d.num_prompts or len(source.rows)
    prompts = [source.prompt_at(i) for i in range(count)]
    sampling = Sampling.from_generation(recipe.generation)
    in_flight = asyncio.Semaphore(d.prompts_in_flight)

    async def one(prompt: Prompt) -> list[Trajectory] | None:
        async with in_flight:
            return await sample_group(prompt)

    async def sample_group(prompt: Prompt) -> list[Trajectory] | None:
        # As GRPO's groups: prompt i's sample k draws seed + i·K + k.
        mine = sampling.for_group(prompt.index, d.samples_per_prompt, prompt.max_tokens)
        try:
            return await agent.group(prompt, d.samples_per_prompt, mine)
        except CallFailed as exc:
            logger.warning("dpo: prompt %s failed: %s", prompt.prompt_id, exc)
            return None

    groups = await asyncio.gather(*(one(p) for p in prompts))
    failed = sum(group is None for group in groups)
    allowed = int(recipe.grpo.max_failed_group_fraction * len(prompts) + 1e-9)
    if failed > allowed:
        raise TooManyFailures(
            f"dpo: {failed} of {len(prompts)} prompts failed > grpo.max_failed_group_fraction "
            f"({recipe.grpo.max_failed_group_fraction}) allows {allowed}; check the rollout "
            "and reward services (trainer log)"
        )
    metrics: dict[str, float] = {
        "sampling/prompts": float(len(prompts)),
        "sampling/failed_prompts": float(failed),
        "sampling/trajectories": 0.0,
    }
    pairs: list[TokenizedPair] = []
    rows: list[dict[str, Any]] = []
    for prompt, group in zip(prompts, groups, strict=True):
        if group is None:
            continue
        scored = [
            ScoredSample(
                agent.decode(t.token_ids), t.reward, {"verdict": trajectory_verdict(t.tool_calls)}
            )
            for t in group
        ]
        metrics["sampling/trajectories"] += len(group)
        for sample in scored:
            key = f"sampling/verdict/{sample.info['verdict']}"
            metrics[key] = metrics.get(key, 0.0) + 1
        for good, bad in pick_pairs(scored, d.max_pairs_per_prompt):
            pairs.append(_tokenized(group[good], group[bad]))
            rows.append(_pair_row(agent, prompt, scored, group, good, bad))
    metrics["sampling/pairs"] = float(len(pairs))
    return SampledPairs(pairs, rows, metrics)


def _tokenized(chosen: Trajectory, rejected: Trajectory) -> TokenizedPair:
    # Both start from the same rendered prompt (the row and the episode's tools).
    return TokenizedPair(
        list(chosen.prompt_token_ids),
        list(chosen.token_ids),
        list(rejected.token_ids),
        chosen.loss_mask,
        rejected.loss_mask,
    )


def _pair_row(
    agent: AgentRollout,
    prompt: Prompt,
    scored: list[ScoredSample],
    group: list[Trajectory],
    good: int,
    bad: int,
) -> dict[str, Any]:
    """pairs.jsonl's row: a preference pair whose chosen / rejected is the whole exchange
    after the prompt as text (as heldout_<label>.jsonl shows a trajectory)."""
    row = PreferencePair(
        prompt=row_messages(json.loads(prompt.row_json)),
        chosen=scored[good].text or "(empty)",
        rejected=scored[bad].text or "(empty)",
        metadata={
            "prompt_id": prompt.prompt_id,
            "chosen": {"reward": scored[good].reward, "tool_calls": group[good].tool_calls},
            "rejected": {
                "reward": scored[bad].reward,
                "verdict": scored[bad].info["verdict"],
                "tool_calls": group[bad].tool_calls,
            },
        },
    )
    return row.model_dump(exclude_defaults=True) | {"metadata": row.metadata}
