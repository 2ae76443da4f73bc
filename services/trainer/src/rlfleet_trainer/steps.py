"""The pieces of one GRPO step that are not I/O: from scored groups to a train batch and
its data metrics, and the loss config from a recipe."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from rlfleet_contracts.recipe import RecipeConfig

from rlfleet_trainer.algorithms import (
    REWARD_TIE,
    compute_grpo_advantages,
    normalize_advantages_per_env,
    sample_loss_multiplier,
    zero_variance_groups,
)
from rlfleet_trainer.batch import TrainBatch, Trajectory, build_train_batch
from rlfleet_trainer.env_metrics import env_metrics
from rlfleet_trainer.replay import PromptGroup


@dataclass
class PreparedStep:
    batch: TrainBatch | None
    """None when every group was dropped."""
    trained: list[PromptGroup]
    metrics: dict[str, float]


def split_informative(
    groups: Sequence[PromptGroup], dynamic_sampling: bool
) -> tuple[list[PromptGroup], list[PromptGroup]]:
    """(kept, zero-variance groups dropped by dynamic sampling)."""
    if not dynamic_sampling or not groups:
        return list(groups), []
    flat_PG = torch.tensor([g.rewards for g in groups], dtype=torch.float64)
    zero_P = zero_variance_groups(flat_PG).tolist()
    kept = [g for g, zero in zip(groups, zero_P, strict=True) if not zero]
    dropped = [g for g, zero in zip(groups, zero_P, strict=True) if zero]
    return kept, dropped


def prepare_step(
    groups: Sequence[PromptGroup], recipe: RecipeConfig, current_version: int, pad_token_id: int
) -> PreparedStep:
    """Advantages per group, loss multipliers per sample, the padded batch and the
    step's data metrics (rewards per env, advantages, lengths, policy lag)."""
    g = recipe.grpo
    metrics = data_metrics(groups, current_version)
    if not groups:
        return PreparedStep(None, [], metrics)
    rewards_PG = torch.tensor([grp.rewards for grp in groups], dtype=torch.float64)
    advantages_PG = compute_grpo_advantages(
        rewards_PG,
        leave_one_out=g.use_leave_one_out_baseline,
        normalize=g.normalize_rewards,
        clip=None if g.normalize_advantages_per_env else g.advantage_clip,
    )
    if g.normalize_advantages_per_env:
        envs_N = [grp.env for grp in groups for _ in grp.samples]
        advantages_PG = normalize_advantages_per_env(advantages_PG.flatten(), envs_N).view_as(
            advantages_PG
        )
        if g.advantage_clip is not None:
            advantages_PG = advantages_PG.clamp(-g.advantage_clip, g.advantage_clip)
    samples: list[Trajectory] = []
    for grp, advantages_G in zip(groups, advantages_PG.tolist(), strict=True):
        for sample, advantage in zip(grp.samples, advantages_G, strict=True):
            sample.advantage = advantage
            samples.append(sample)
    multipliers_N = sample_loss_multiplier(
        torch.tensor([s.truncated for s in samples]),
        torch.tensor([s.reward_masked for s in samples]),
        g.overlong_filtering,
    )
    adv = advantages_PG.flatten()
    metrics.update(
        {
            "advantages/mean": float(adv.mean()),
            "advantages/std": float(adv.std()) if adv.numel() > 1 else 0.0,
            "advantages/min": float(adv.min()),
            "advantages/max": float(adv.max()),
            "samples/loss_weight_zero_fraction": float((multipliers_N == 0).float().mean()),
        }
    )
    batch = build_train_batch(samples, multipliers_N, pad_token_id)
    return PreparedStep(batch, list(groups), metrics)


def data_metrics(groups: Sequence[PromptGroup], current_version: int) -> dict[str, float]:
    """reward/mean, reward/<env>, frac_reward_zero_std, response length, truncation,
    policy lag (current weight version − the version each sample was generated under),
    and the per-environment metrics of `env_metrics` (NeMo-RL's names)."""
    samples = [s for grp in groups for s in grp.samples]
    if not samples:
        return {}
    by_env: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        by_env[s.env].append(s.reward)
    lags = [current_version - s.weight_version for s in samples]
    lengths = [s.num_generated for s in samples]
    metrics = {
        "reward/mean": statistics.fmean(s.reward for s in samples),
        "frac_reward_zero_std": statistics.fmean(
            float(max(grp.rewards) - min(grp.rewards) <= REWARD_TIE) for grp in groups
        ),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/max": float(max(lengths)),
        "truncated_fraction": statistics.fmean(float(s.truncated) for s in samples),
        "policy_lag/mean": statistics.fmean(lags),
        "policy_lag/max": float(max(lags)),
    }
    for env, rewards in by_env.items():
        metrics[f"reward/{env}"] = statistics.fmean(rewards)
    metrics.update(env_metrics(groups))
    metrics.update(multi_turn_metrics(samples))
    return metrics


def multi_turn_metrics(samples: Sequence[Trajectory]) -> dict[str, float]:
    """Over the multi-turn trajectories (those with a loss mask): model turns per
    trajectory, and the share that called a tool at least once (environment tokens
    follow a call, well-formed or not). A share of 0 means no group can tell a call from
    none: the reward cannot teach calling."""
    agentic = [s for s in samples if s.loss_mask is not None]
    if not agentic:
        return {}
    return {
        "multi_turn/turns/mean": statistics.fmean(len(s.turn_weight_versions) for s in agentic),
        "multi_turn/tool_call_rate": statistics.fmean(
            float(0 in (s.loss_mask or ())) for s in agentic
        ),
    }
