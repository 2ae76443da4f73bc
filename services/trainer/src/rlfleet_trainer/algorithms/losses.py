"""The clipped policy-gradient loss of GRPO as NeMo-RL's ClippedPGLossFn defines it:
PPO clipping with separate low/high epsilons (clip-higher, DAPO), optional dual clip
(Ye et al. 2020), token- or sequence-level normalisation, GSPO sequence ratios
(Zheng et al. 2025), train/inference importance correction and a KL penalty.

    r_t     = exp(log π_θ − log π_prev)           (GSPO: r_b = exp(mean_t(log π_θ − log π_prev)))
    L^clip  = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high))
    dual    : for A < 0, L^clip ← min(L^clip, −A·c)          (c > 1)
    L_t     = w_t · L^clip_t + β · κ_t · KL_t                 (w: importance weight, κ: 1 or
                                                                exp(log π_θ − log π_gen) detached)
    token   : L = Σ_{b,t} m_bt · L_bt / N_tokens              (N over the global batch)
    sequence: L = Σ_b (Σ_t m_bt · L_bt / n_b) / N_sequences

Normalisers are global (the whole optimizer step's batch), so micro-batch losses simply
add up under gradient accumulation; every metric here is additive the same way.

Shape legend: B = sequences in the micro-batch, T = response tokens (padded).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from rlfleet_contracts.recipe import GRPOConfig

from rlfleet_trainer.algorithms.importance import (
    compute_importance_weights,
    masked_sequence_mean,
    sequence_logprob_error,
    sequence_logprob_error_keep,
)
from rlfleet_trainer.algorithms.kl import compute_kl

LOSS_LEVELS: tuple[str, ...] = ("token", "sequence")


@dataclass
class LossInputs:
    """One micro-batch. `mask_BT` already includes per-sample weights (overlong filter,
    reward `mask_sample`, dynamic sampling): a 0 row contributes nothing."""

    logprobs_BT: torch.Tensor
    generation_logprobs_BT: torch.Tensor
    advantages_B: torch.Tensor
    mask_BT: torch.Tensor
    prev_logprobs_BT: torch.Tensor | None = None
    reference_logprobs_BT: torch.Tensor | None = None
    entropy_BT: torch.Tensor | None = None


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    """Additive contributions: summing them over the micro-batches of a step gives the
    step's value (each is normalised by the global token or sequence count)."""


def clipped_surrogate(
    ratio_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    clip_min: float,
    clip_max: float,
    dual_clip_c: float | None = None,
) -> torch.Tensor:
    """L = max(−A·r, −A·clip(r, 1 − clip_min, 1 + clip_max)); with dual clip c, for A < 0:
    L ← min(L, −A·c), bounding the loss of very large ratios on negative advantages."""
    clipped_ratio_BT = ratio_BT.clamp(1.0 - clip_min, 1.0 + clip_max)
    loss_BT = torch.maximum(-advantages_BT * ratio_BT, -advantages_BT * clipped_ratio_BT)
    if dual_clip_c is not None:
        loss_BT = torch.where(
            advantages_BT < 0, torch.minimum(loss_BT, -advantages_BT * dual_clip_c), loss_BT
        )
    return loss_BT


def gspo_log_ratio(
    logprobs_BT: torch.Tensor, prev_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """GSPO: log r_b = mean_t(log π_θ − log π_prev) over valid tokens, broadcast to every
    token of the sequence (the gradient reaches each token through the mean)."""
    seq_log_ratio_B = masked_sequence_mean(logprobs_BT - prev_logprobs_BT, mask_BT)
    return seq_log_ratio_B.unsqueeze(1).expand_as(logprobs_BT)


def aggregate_loss(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    level: str,
    global_valid_tokens: float,
    global_valid_sequences: float,
) -> torch.Tensor:
    """token: Σ m·L / N_tokens;  sequence: Σ_b (Σ_t m·L / n_b) / N_sequences."""
    if level == "token":
        return (loss_BT * mask_BT).sum() / max(global_valid_tokens, 1.0)
    if level == "sequence":
        return masked_sequence_mean(loss_BT, mask_BT).sum() / max(global_valid_sequences, 1.0)
    raise ValueError(f"unknown loss_level {level!r}; valid: {', '.join(LOSS_LEVELS)}")


def compute_policy_loss(
    inputs: LossInputs,
    config: GRPOConfig,
    global_valid_tokens: float,
    global_valid_sequences: float,
) -> LossOutput:
    """The GRPO loss of one micro-batch (module docstring has the formula) and its metrics;
    its knobs are the recipe's `grpo.*` section (recipe.py documents each one)."""
    mask_BT = inputs.mask_BT.to(inputs.logprobs_BT.dtype)
    logprobs_BT = inputs.logprobs_BT
    if config.force_on_policy_ratio or inputs.prev_logprobs_BT is None:
        # One optimizer update per rollout batch: π_prev is π_θ itself, so r = 1 exactly
        # and the gradient is A·∇log π_θ (NeMo-RL's force_on_policy_ratio).
        prev_BT = logprobs_BT.detach()
    else:
        prev_BT = inputs.prev_logprobs_BT
    gen_BT = inputs.generation_logprobs_BT

    is_weights = compute_importance_weights(
        prev_BT,
        gen_BT,
        mask_BT,
        config.importance_sampling,
        config.importance_weight_min,
        config.importance_weight_max,
    )
    error_keep_B = sequence_logprob_error_keep(
        prev_BT, gen_BT, mask_BT, config.seq_logprob_error_threshold
    )
    keep_BT = (is_weights.sequence_keep_B * error_keep_B).unsqueeze(1) * mask_BT

    if config.sequence_level_importance_ratios:
        log_ratio_BT = gspo_log_ratio(logprobs_BT, prev_BT, mask_BT)
    else:
        log_ratio_BT = logprobs_BT - prev_BT
    ratio_BT = log_ratio_BT.exp()
    advantages_BT = inputs.advantages_B.to(ratio_BT.dtype).unsqueeze(1).expand_as(ratio_BT)
    surrogate_BT = clipped_surrogate(
        ratio_BT, advantages_BT, config.ratio_clip_min, config.ratio_clip_max, config.ratio_clip_c
    )
    loss_BT = is_weights.weights_BT * surrogate_BT

    kl_BT = torch.zeros_like(loss_BT)
    if inputs.reference_logprobs_BT is not None:
        kl_BT = compute_kl(
            logprobs_BT,
            inputs.reference_logprobs_BT,
            config.kl_type,
            config.kl_input_clamp,
            config.kl_output_clamp,
        )
        if config.kl_coef > 0:
            kl_weight_BT = torch.ones_like(kl_BT)
            if config.use_on_policy_kl_approximation:
                kl_weight_BT = torch.nan_to_num(
                    (logprobs_BT - gen_BT).detach().exp(), nan=0.0, posinf=0.0, neginf=0.0
                )
            loss_BT = loss_BT + config.kl_coef * kl_weight_BT * kl_BT

    loss = aggregate_loss(
        loss_BT, keep_BT, config.loss_level, global_valid_tokens, global_valid_sequences
    )
    metrics = compute_loss_metrics(
        ratio_BT.detach(),
        advantages_BT,
        mask_BT,
        is_weights.out_of_bounds_BT,
        sequence_logprob_error(prev_BT, gen_BT, mask_BT),
        kl_BT.detach(),
        inputs.entropy_BT,
        config,
        global_valid_tokens,
        global_valid_sequences,
    )
    metrics["loss"] = float(loss.detach())
    metrics["masked_sequence_fraction"] = float(
        ((1 - is_weights.sequence_keep_B * error_keep_B) * (mask_BT.sum(1) > 0)).sum()
        / max(global_valid_sequences, 1.0)
    )
    return LossOutput(loss=loss, metrics=metrics)


def compute_loss_metrics(
    ratio_BT: torch.Tensor,
    advantages_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    out_of_bounds_BT: torch.Tensor,
    logprob_error_B: torch.Tensor,
    kl_BT: torch.Tensor,
    entropy_BT: torch.Tensor | None,
    config: GRPOConfig,
    global_valid_tokens: float,
    global_valid_sequences: float,
) -> dict[str, float]:
    """Token fractions over the global valid tokens (additive over micro-batches):

    - clip_fraction/low : r < 1 − ε_low and A < 0 (the lower clip is active)
    - clip_fraction/high: r > 1 + ε_high and A > 0 (the upper clip is active)
    - clip_fraction/dual: A < 0 and r > c (the dual clip is active)
    - is_oob_ratio      : the importance weight lay outside its bounds
    - token_mult_prob_error: mean_t exp(|log π_gen − log π_prev|) (1.0 = engines agree)
    - kl, entropy, ratio_mean: token means.
    """
    n_tokens = max(global_valid_tokens, 1.0)

    def token_mean(values_BT: torch.Tensor) -> float:
        return float((values_BT.float() * mask_BT).sum() / n_tokens)

    low_BT = (ratio_BT < 1.0 - config.ratio_clip_min) & (advantages_BT < 0)
    high_BT = (ratio_BT > 1.0 + config.ratio_clip_max) & (advantages_BT > 0)
    metrics = {
        "clip_fraction/low": token_mean(low_BT),
        "clip_fraction/high": token_mean(high_BT),
        "is_oob_ratio": token_mean(out_of_bounds_BT),
        "token_mult_prob_error": float((logprob_error_B * mask_BT.sum(1)).sum() / n_tokens),
        "kl": token_mean(kl_BT),
        "ratio_mean": token_mean(ratio_BT),
    }
    if config.ratio_clip_c is not None:
        metrics["clip_fraction/dual"] = token_mean(
            (advantages_BT < 0) & (ratio_BT > config.ratio_clip_c)
        )
    if entropy_BT is not None:
        metrics["entropy"] = token_mean(entropy_BT.detach())
    return metrics
