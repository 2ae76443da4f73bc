"""Tracker names of rlfleet's metrics: NeMo-RL's name where the quantity is the same
(docs/trainer.md "Metrics" has the table); metrics.jsonl keeps rlfleet's own names."""

from __future__ import annotations

NEMO_RL_NAMES: dict[str, str] = {
    "reward/mean": "train/reward",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "timing/step_s": "timing/train/total_step_time",
    "val/accuracy": "validation/accuracy",
}
"""rlfleet metric → NeMo-RL's tracker name, for the quantities both compute the same way."""


def tracker_name(key: str) -> str:
    """NeMo-RL's name when the table has one; otherwise NeMo-RL's layout: validation under
    `validation/`, timings under `timing/train/`, the rest under `train/`."""
    if key in NEMO_RL_NAMES:
        return NEMO_RL_NAMES[key]
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
