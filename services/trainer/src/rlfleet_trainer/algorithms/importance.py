"""Train/inference mismatch correction: importance weights between the policy the
trainer scores with (π_prev) and the engine that sampled the tokens (π_gen).

Shape legend: B = sequences, T = response tokens (padded); mask_BT is 1 on valid tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IS_MODES: tuple[str, ...] = ("none", "tis", "icepop", "seq-mask-tis")


def masked_sequence_mean(values_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """mean_t values[b, t] over valid tokens of each sequence; 0 for an empty one."""
    count_B = mask_BT.sum(dim=1)
    return (values_BT * mask_BT).sum(dim=1) / count_B.clamp(min=1)


@dataclass
class ImportanceWeights:
    weights_BT: torch.Tensor
    """w multiplying each token's loss (detached)."""
    sequence_keep_B: torch.Tensor
    """1.0 for sequences kept, 0.0 for sequences masked by seq-mask-tis."""
    out_of_bounds_BT: torch.Tensor
    """1.0 where the raw token weight lies outside the mode's bounds (for the OOB ratio)."""


def compute_importance_weights(
    prev_logprobs_BT: torch.Tensor,
    generation_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str,
    weight_min: float = 0.0,
    weight_max: float = 5.0,
) -> ImportanceWeights:
    """w_t = exp(log π_prev − log π_gen), then per mode:

    - ``none``: w = 1 (no correction).
    - ``tis`` (truncated IS): w ← clamp(w, 0, weight_max); OOB where w > weight_max.
    - ``icepop``: w ← w where weight_min ≤ w ≤ weight_max, else 0 (token dropped).
    - ``seq-mask-tis``: the sequence's geometric-mean weight
      ŵ_b = exp(mean_t(log π_prev − log π_gen)); sequences with ŵ_b outside
      [weight_min, weight_max] are masked; kept tokens carry the untruncated w.
    """
    log_weight_BT = (prev_logprobs_BT - generation_logprobs_BT).detach()
    raw_BT = log_weight_BT.exp()
    keep_B = torch.ones(raw_BT.shape[0], dtype=raw_BT.dtype, device=raw_BT.device)
    if mode == "none":
        return ImportanceWeights(torch.ones_like(raw_BT), keep_B, torch.zeros_like(raw_BT))
    if mode == "tis":
        out_BT = (raw_BT > weight_max).to(raw_BT.dtype)
        weights_BT = raw_BT.clamp(0.0, weight_max)
    elif mode == "icepop":
        inside_BT = (raw_BT >= weight_min) & (raw_BT <= weight_max)
        out_BT = (~inside_BT).to(raw_BT.dtype)
        weights_BT = torch.where(inside_BT, raw_BT, torch.zeros_like(raw_BT))
    elif mode == "seq-mask-tis":
        seq_weight_B = masked_sequence_mean(log_weight_BT, mask_BT).exp()
        keep_B = ((seq_weight_B >= weight_min) & (seq_weight_B <= weight_max)).to(raw_BT.dtype)
        out_BT = (1.0 - keep_B).unsqueeze(1).expand_as(raw_BT).contiguous()
        weights_BT = raw_BT
    else:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; valid: {', '.join(IS_MODES)}")
    return ImportanceWeights(weights_BT * mask_BT, keep_B, out_BT * mask_BT)


def sequence_logprob_error(
    prev_logprobs_BT: torch.Tensor, generation_logprobs_BT: torch.Tensor, mask_BT: torch.Tensor
) -> torch.Tensor:
    """e_b = mean_t exp(|log π_gen − log π_prev|) over valid tokens (1.0 = identical).
    Its token-weighted mean over the batch is the `token_mult_prob_error` metric."""
    error_BT = (generation_logprobs_BT - prev_logprobs_BT).abs().detach().exp()
    return masked_sequence_mean(error_BT, mask_BT)


def sequence_logprob_error_keep(
    prev_logprobs_BT: torch.Tensor,
    generation_logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    threshold: float | None,
) -> torch.Tensor:
    """keep_b = 1 if e_b ≤ threshold else 0 (whole sample masked); all 1 when off."""
    error_B = sequence_logprob_error(prev_logprobs_BT, generation_logprobs_BT, mask_BT)
    if threshold is None:
        return torch.ones_like(error_B)
    return (error_B <= threshold).to(error_B.dtype)
