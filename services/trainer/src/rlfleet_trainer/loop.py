"""The GRPO main loop, synchronous and asynchronous.

Synchronous (`grpo.max_trajectory_age_steps=0`): generate a step's prompt groups with the
current weights, train, publish, repeat — generation and training never overlap.
Asynchronous (age ≥ 1): the collector keeps `prompts_per_step × max_age × 2` groups in
flight or buffered while the policy trains; after each step the new weights are pushed to
the rollout service in flight, and groups older than `max_age` versions are dropped.
Training runs in a worker thread so the event loop keeps streaming results meanwhile.

`run_grpo` is the whole loop, top to bottom; `context.RunContext` holds what setup built.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from rlfleet_contracts.recipe import GRPOConfig, RecipeConfig
from rlfleet_core.tracking import MetricsLogger

from rlfleet_trainer.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from rlfleet_trainer.collector import Collector
from rlfleet_trainer.context import RunContext
from rlfleet_trainer.faults import crash_hook, hold_hook
from rlfleet_trainer.ledger import Ledger, LedgerEntry
from rlfleet_trainer.ranks import TrainerBackend
from rlfleet_trainer.replay import PromptGroup
from rlfleet_trainer.steps import prepare_step, split_informative
from rlfleet_trainer.validation import read_heldout, validate, write_heldout

logger = logging.getLogger(__name__)

MAX_DYNAMIC_SAMPLING_ROUNDS = 8
"""Dynamic sampling collects more groups until the step has num_prompts_per_step
informative ones, at most this many rounds; then it trains on what it has."""

MAX_EMPTY_STEPS = 3
"""Consecutive steps without a single informative group before the run stops."""


async def run_grpo(ctx: RunContext, resume: bool = False) -> TrainerState:
    """Train `grpo.max_num_steps` steps (continuing from the latest checkpoint if
    `resume`); returns the final state. Every prompt issued ends in the ledger."""
    recipe, g = ctx.recipe, ctx.recipe.grpo
    ledger = Ledger(ctx.folder.ledger)
    collector = Collector.from_recipe(
        recipe,
        ctx.source,
        ctx.rollout,
        ctx.reward,
        lambda ids: ctx.tokenizer.decode(ids, skip_special_tokens=True),
        ctx.tokenizer,
    )
    state = await restore_or_start(ctx, ledger, collector, resume)
    limit = g.num_prompts_per_step * max(2 * g.max_trajectory_age_steps, 1)
    collector.auto_fill_limit = limit if g.async_enabled else None
    metrics_log = MetricsLogger(
        ctx.run_dir, recipe.logger, run_name=recipe.stage, jsonl=ctx.folder.metrics
    )
    empty_steps = 0
    unlogged: dict[str, float] = {}  # failure counts of empty steps, logged with the next step
    if g.val_at_start and "before" not in read_heldout(ctx.folder):
        ctx.status["phase"] = "validating"
        write_heldout(ctx.folder, "before", await validate(ctx, "before"))
    try:
        while state.step < g.max_num_steps:
            started = time.monotonic()
            ctx.status["phase"] = "generating"
            groups, rounds = await gather_groups(ctx, collector, state.weight_version, limit)
            failures = carry_failures(unlogged, collector.end_step())
            waited = time.monotonic() - started
            prepared = prepare_step(
                groups, recipe, state.weight_version, ctx.tokenizer.pad_token_id or 0
            )
            if prepared.batch is None:
                ledger_step(ledger, collector, [], state)
                empty_steps += 1
                if empty_steps >= MAX_EMPTY_STEPS:
                    raise RuntimeError(
                        f"dynamic sampling found no group with reward variance in "
                        f"{empty_steps * MAX_DYNAMIC_SAMPLING_ROUNDS} rounds; the task is all "
                        "solved or all failed: check the rewards or set grpo.dynamic_sampling=false"
                    )
                unlogged = failures
                continue
            empty_steps = 0
            unlogged = {}
            ctx.status["phase"] = "training"
            train_metrics, timings = await train_on(ctx.backend, prepared.batch, g)
            state.step += 1
            state.weight_version += 1
            crash_hook("after_train", state.step)
            state.ledger_bytes = ledger_step(ledger, collector, prepared.trained, state)
            crash_hook("after_ledger", state.step)
            ctx.status["phase"] = "publishing"
            timings["publish_s"] = await publish_weights(ctx, state.weight_version)
            crash_hook("after_publish", state.step)
            metrics = {
                **prepared.metrics,
                **train_metrics,
                **{f"timing/{k}": v for k, v in timings.items()},
                "timing/wait_for_groups_s": waited,
                "timing/step_s": time.monotonic() - started,
                "throughput/train_tokens_per_s": prepared.batch.num_tokens
                / max(timings["train_s"], 1e-9),
                "dynamic_sampling/rounds": float(rounds),
                **{f"dropped/{k}": float(v) for k, v in collector.stats.drops.items()},
                **failures,
                "weight_version": float(state.weight_version),
            }
            if g.val_every_steps and state.step % g.val_every_steps == 0:
                val = (await validate(ctx)).metrics
                metrics.update({f"val/{k}": v for k, v in val.items()})
            log_step(metrics_log, state, metrics, ctx)
            if checkpoint_due(recipe, state.step) or ctx.checkpoint_requests:
                ctx.status["phase"] = "checkpointing"
                path = write_checkpoint(ctx, ledger, collector, state)
                crash_hook("after_checkpoint", state.step)
                hold_hook(ctx.run_dir, "after_checkpoint", state.step)
                answer_checkpoint_requests(ctx, path, state.step)
        await collector.shutdown(state.step)
        state.ledger_bytes = ledger_step(ledger, collector, [], state)
        state.data_cursor = ctx.source.cursor
        if g.val_at_end:
            ctx.status["phase"] = "validating"
            write_heldout(ctx.folder, "after", await validate(ctx, "after"))
        ctx.status["phase"] = "idle"
        return state
    finally:
        metrics_log.close()
        await collector.cancel()


def carry_failures(unlogged: dict[str, float], step: dict[str, float]) -> dict[str, float]:
    """A step's `failures/*` (and `genrm/*`) plus those of the empty steps before it
    (which log no row): counts add up; the failing-steps streak is the latest value."""
    merged = dict(step)
    for key, value in unlogged.items():
        if key != "failures/failing_steps":
            merged[key] = merged.get(key, 0.0) + value
    if merged.get("genrm/busy_s"):  # a rate does not add up: recomputed from the sums
        merged["genrm/comparisons_per_s"] = merged["genrm/comparisons"] / merged["genrm/busy_s"]
    return merged


async def restore_or_start(
    ctx: RunContext, ledger: Ledger, collector: Collector, resume: bool
) -> TrainerState:
    """Fresh: state 0 (publishing the starting weights first unless the rollout already
    serves them at version 0).
    Resume: restore the latest checkpoint, cut the ledger back to it, re-issue its
    in-flight prompts, and publish the restored weights under a version newer than any
    the rollout has seen; buffered groups are re-based by the same offset so their lag
    is unchanged."""
    path = latest_checkpoint(ctx.checkpoint_dir) if resume else None
    if path is None:
        if resume:
            logger.info("no checkpoint in %s: starting fresh", ctx.checkpoint_dir)
        ledger.truncate(0)
        served, served_model = await ctx.rollout.served()
        state = TrainerState()
        if served != 0 or not same_weights(served_model, ctx.recipe.policy.model):
            # The rollout serves other weights (an earlier stage's, or another model):
            # publish ours before the first sample is drawn.
            state.weight_version = served + 1
            await publish_weights(ctx, state.weight_version)
        return state
    state = load_checkpoint(path, ctx.backend)
    ledger.truncate(state.ledger_bytes)
    ctx.source.cursor = state.data_cursor
    collector.restore(state.collector)
    collector.buffer.load_json(state.replay_buffer)
    served = await ctx.rollout.weight_version()
    new_version = max(state.weight_version, served) + 1
    collector.buffer.rebase_versions(new_version - state.weight_version)
    state.weight_version = new_version
    await publish_weights(ctx, new_version)
    logger.info("resumed from %s at step %d (weight version %d)", path, state.step, new_version)
    return state


def same_weights(served_model: str, policy_model: str) -> bool:
    """Whether the rollout's initial model is the policy's starting model."""
    from rlfleet_core.models import resolve_model

    try:
        # A served name may be any string (served_model_name): never download it.
        served = resolve_model(served_model, download=False)
        return served.resolve() == resolve_model(policy_model, download=False).resolve()
    except Exception:  # a served name we cannot resolve here: assume it differs
        return False


async def gather_groups(
    ctx: RunContext, collector: Collector, version: int, limit: int
) -> tuple[list[PromptGroup], int]:
    """num_prompts_per_step fresh groups; with dynamic sampling, zero-variance groups are
    dropped (`zero_variance`) and replaced, for at most MAX_DYNAMIC_SAMPLING_ROUNDS."""
    g = ctx.recipe.grpo
    kept: list[PromptGroup] = []
    rounds = 0
    while rounds < MAX_DYNAMIC_SAMPLING_ROUNDS:
        rounds += 1
        need = g.num_prompts_per_step - len(kept)
        await collector.wait_for_groups(need, version, limit)
        informative, zero = split_informative(collector.take(need), g.dynamic_sampling)
        kept += informative
        for group in zero:
            collector.drop(group.prompt_id, "zero_variance")
        if len(kept) >= g.num_prompts_per_step:
            break
    # In prompt order, not arrival order: the batch (and each rank's slice of it) and the
    # ledger then do not depend on which request finished first.
    return sorted(kept, key=lambda group: group.prompt_id), rounds


async def train_on(
    backend: TrainerBackend, batch: Any, grpo: GRPOConfig
) -> tuple[dict[str, float], dict[str, float]]:
    """prev/reference logprobs (when needed), then one optimizer step, in a worker thread
    so generation results keep streaming in. Several ranks: the driver sends the batch to
    every rank and each trains on its slice (`ranks.DriverBackend.train`)."""
    return await asyncio.to_thread(backend.train, batch, grpo)


def ledger_step(
    ledger: Ledger, collector: Collector, trained: list[PromptGroup], state: TrainerState
) -> int:
    """Append this step's outcomes (trained groups + every drop since the last step)."""
    entries = [LedgerEntry(g.prompt_id, "trained", "", state.step) for g in trained]
    entries += [LedgerEntry(d.prompt_id, d.outcome, d.reason, state.step) for d in collector.drops]
    collector.drops.clear()
    return ledger.append(entries)


async def publish_weights(ctx: RunContext, version: int) -> float:
    """Push the policy's HF-named weights to the rollout service as `version`, over the
    rollout client's weight sender (made once, by `context.build_context`)."""
    started = time.monotonic()
    g = ctx.recipe.grpo
    tensors = await asyncio.to_thread(lambda: list(ctx.backend.hf_state_dict()))
    if g.async_enabled and not g.in_flight_weight_updates:
        # Let requests in flight finish under the old weights before the update.
        await ctx.rollout.pause_until_drained()
    try:
        await ctx.rollout.publish_weights(
            version, tensors, recompute_kv_cache=g.recompute_kv_cache_after_weight_updates
        )
    finally:
        if g.async_enabled and not g.in_flight_weight_updates:
            await ctx.rollout.resume()
    return time.monotonic() - started


def answer_checkpoint_requests(ctx: RunContext, path: Path, step: int) -> None:
    for future in ctx.checkpoint_requests:
        if not future.done():
            future.set_result((path, step))
    ctx.checkpoint_requests.clear()


def checkpoint_due(recipe: RecipeConfig, step: int) -> bool:
    every = recipe.checkpoint.save_every_steps
    return step == recipe.grpo.max_num_steps or (every > 0 and step % every == 0)


def write_checkpoint(
    ctx: RunContext, ledger: Ledger, collector: Collector, state: TrainerState
) -> Path:
    """Snapshot without yielding to the event loop: drops that happened since the step
    go to the ledger first, then collector, buffer and cursor are captured together."""
    state.ledger_bytes = ledger_step(ledger, collector, [], state)
    state.data_cursor = ctx.source.cursor
    state.collector = collector.state()
    state.replay_buffer = collector.buffer.to_json()
    return save_checkpoint(
        ctx.checkpoint_dir,
        state,
        ctx.backend,
        ctx.recipe.checkpoint.keep_last,
        crash_hook=lambda point: crash_hook(point, state.step),
    )


def log_step(
    log: MetricsLogger, state: TrainerState, metrics: dict[str, float], ctx: RunContext
) -> None:
    state.last_metrics = metrics
    ctx.status.update(step=state.step, weight_version=state.weight_version, metrics=metrics)
    log.log(state.step, metrics)
    logger.info(
        "step %d reward %.3f loss %.4f lag %.1f",
        state.step,
        metrics.get("reward/mean", float("nan")),
        metrics.get("loss", float("nan")),
        metrics.get("policy_lag/max", 0.0),
    )
    if ctx.on_step is not None:
        ctx.on_step(state.step, metrics)
