"""Tracker names of rlfleet's metrics: NeMo-RL's name where the quantity is the same
(docs/trainer.md "Trackers" has the table and the NeMo-RL source it was checked against);
metrics.jsonl keeps rlfleet's own names."""

from __future__ import annotations

NEMO_RL_NAMES: dict[str, str] = {
    "reward/mean": "train/reward",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "ratio_mean": "train/probs_ratio",
    "kl": "train/kl_penalty",
    "response_length/mean": "train/mean_gen_tokens_per_sample",
    "response_length/max": "train/max_gen_tokens_per_sample",
    "truncated_fraction": "train/truncation_rate",
    "policy_lag/mean": "train/avg_trajectory_age",
    "dynamic_sampling/rounds": "train/dynamic_sampling_num_gen_batches",
    "timing/step_s": "timing/train/total_step_time",
    "timing/logprobs_s": "timing/train/policy_and_reference_logprobs",
    "timing/train_s": "timing/train/policy_training",
    "val/reward": "validation/accuracy",
}
"""rlfleet metric → NeMo-RL's tracker name, for the quantities both compute the same way."""

OWN_NAMES: dict[str, str] = {
    "val/accuracy": "validation/full_reward_fraction",
    "advantages/mean": "train/advantages_per_sample/mean",
    "advantages/std": "train/advantages_per_sample/std",
    "advantages/min": "train/advantages_per_sample/min",
    "advantages/max": "train/advantages_per_sample/max",
}
"""rlfleet metrics whose name in NeMo-RL's layout would be a NeMo-RL name of another
quantity: NeMo-RL's `validation/accuracy` is the mean reward (rlfleet's `val/reward`),
its `train/advantages/*` are over response tokens (rlfleet's are over samples)."""


def tracker_name(key: str) -> str:
    """NeMo-RL's name when the table has one; otherwise NeMo-RL's layout: validation under
    `validation/`, timings under `timing/train/`, the rest under `train/`."""
    if key in NEMO_RL_NAMES:
        return NEMO_RL_NAMES[key]
    if key in OWN_NAMES:
        return OWN_NAMES[key]
    for jsonl, tracker in (("val/reward/", "validation/"), ("reward/", "train/")):
        if key.startswith(jsonl):
            # `train/reward` is the mean: a tracker name cannot also be a folder of others
            # (MLflow's file store), so the per-environment means move beside it.
            return f"{tracker}reward_by_env/{key.removeprefix(jsonl)}"
    if key.startswith("val/"):
        return "validation/" + key.removeprefix("val/")
    if key.startswith("timing/"):
        return "timing/train/" + key.removeprefix("timing/")
    if key.startswith(("train/", "validation/", "pipeline/")):
        return key
    return "train/" + key
