"""rlfleet-weights: weight transport from the trainer to the rollout engines."""
