"""GRPO math as pure functions over tensors: advantages, the clipped loss with its
importance correction and KL penalty, sample filters. Each docstring states its formula;
tests/test_algorithms_*.py pin every one to hand-computed numbers."""

from rlfleet_trainer.algorithms.advantages import (
    REWARD_TIE,
    compute_baseline_and_std,
    compute_grpo_advantages,
    normalize_advantages_per_env,
    zero_variance_groups,
)
from rlfleet_trainer.algorithms.filtering import (
    dapo_overlong_penalty,
    overlong_loss_multiplier,
    sample_loss_multiplier,
)
from rlfleet_trainer.algorithms.importance import (
    compute_importance_weights,
    sequence_logprob_error,
    sequence_logprob_error_keep,
)
from rlfleet_trainer.algorithms.kl import compute_kl
from rlfleet_trainer.algorithms.losses import (
    LossInputs,
    LossOutput,
    aggregate_loss,
    clipped_surrogate,
    compute_policy_loss,
    gspo_log_ratio,
)

__all__ = [
    "REWARD_TIE",
    "LossInputs",
    "LossOutput",
    "aggregate_loss",
    "clipped_surrogate",
    "compute_baseline_and_std",
    "compute_grpo_advantages",
    "compute_importance_weights",
    "compute_kl",
    "compute_policy_loss",
    "dapo_overlong_penalty",
    "gspo_log_ratio",
    "normalize_advantages_per_env",
    "overlong_loss_multiplier",
    "sample_loss_multiplier",
    "sequence_logprob_error",
    "sequence_logprob_error_keep",
    "zero_variance_groups",
]
