"""Per-environment metrics of a mixed batch, named as NeMo-RL names them.

NeMo-RL's NeMo-Gym rollout path (nemo_rl/experience/rollouts.py, "per-agent misc
metrics") groups a batch's samples by `agent_ref.name` and logs each numeric field of the
verifier's result as `<agent>/<field>/{mean,max,min,median,stddev}`, the reward among
them: `<agent>/reward/mean`. We group by environment (the `env` / `agent_ref.name` of the
row) and log the same statistics of the reward, plus what NeMo-RL logs for the whole batch
(`gen_tokens_per_sample/mean`, `truncation_rate`) and for math (`accuracy`), per
environment, and the counts that say how much of the batch each environment was.
docs/trainer.md has the table of names against NeMo-RL's.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

from rlfleet_trainer.algorithms import REWARD_TIE
from rlfleet_trainer.replay import PromptGroup

FULL_REWARD = 1.0
"""A sample at this reward or above counts as correct for `accuracy` (NeMo-RL's math
environment: reward == 1)."""


def reward_stats(prefix: str, rewards: Sequence[float]) -> dict[str, float]:
    """NeMo-RL's `calculate_single_metric` statistics (its histogram left out):
    mean, max, min, median and the sample stddev (nan for one value)."""
    return {
        f"{prefix}/mean": statistics.fmean(rewards),
        f"{prefix}/max": max(rewards),
        f"{prefix}/min": min(rewards),
        f"{prefix}/median": statistics.median(rewards),
        f"{prefix}/stddev": statistics.stdev(rewards) if len(rewards) > 1 else math.nan,
    }


def env_metrics(groups: Sequence[PromptGroup]) -> dict[str, float]:
    """`<env>/reward/{mean,max,min,median,stddev}`, `<env>/accuracy`,
    `<env>/gen_tokens_per_sample/mean`, `<env>/truncation_rate`,
    `<env>/frac_reward_zero_std`, `<env>/num_groups`, `<env>/num_samples`."""
    by_env: dict[str, list[PromptGroup]] = defaultdict(list)
    for group in groups:
        by_env[group.env].append(group)
    metrics: dict[str, float] = {}
    for env, env_groups in sorted(by_env.items()):
        samples = [s for g in env_groups for s in g.samples]
        if not samples:
            continue
        rewards = [s.reward for s in samples]
        metrics.update(reward_stats(f"{env}/reward", rewards))
        metrics[f"{env}/accuracy"] = statistics.fmean(
            float(r >= FULL_REWARD - REWARD_TIE) for r in rewards
        )
        metrics[f"{env}/gen_tokens_per_sample/mean"] = statistics.fmean(
            s.num_generated for s in samples
        )
        metrics[f"{env}/truncation_rate"] = statistics.fmean(float(s.truncated) for s in samples)
        metrics[f"{env}/frac_reward_zero_std"] = statistics.fmean(
            float(max(g.rewards) - min(g.rewards) <= REWARD_TIE) for g in env_groups
        )
        metrics[f"{env}/num_groups"] = float(len(env_groups))
        metrics[f"{env}/num_samples"] = float(len(samples))
    return metrics
