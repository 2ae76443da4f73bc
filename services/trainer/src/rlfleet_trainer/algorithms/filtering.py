"""Sample-level filters applied before the loss: overlong filtering (DAPO) and the
per-sample loss multiplier that gathers every reason a sample carries no gradient.

Shape legend: N = samples (prompts × G, flattened).
"""

from __future__ import annotations

import torch


def overlong_loss_multiplier(truncated_N: torch.Tensor, enabled: bool) -> torch.Tensor:
    """m_i = 0 if sample i hit the length limit without EOS and filtering is on, else 1."""
    if not enabled:
        return torch.ones(truncated_N.shape, dtype=torch.float32)
    return (~truncated_N.bool()).float()


def sample_loss_multiplier(
    truncated_N: torch.Tensor,
    reward_masked_N: torch.Tensor,
    overlong_filtering: bool,
) -> torch.Tensor:
    """m_i = overlong_i · (1 − mask_sample_i): the product of every per-sample filter
    (the reward's `mask_sample` asks for no gradient on that sample)."""
    return overlong_loss_multiplier(truncated_N, overlong_filtering) * (
        1.0 - reward_masked_N.float()
    )


def dapo_overlong_penalty(length_N: torch.Tensor, max_length: int, buffer: int) -> torch.Tensor:
    """DAPO's soft length penalty (the reward-shaping alternative to filtering):
    0 for L ≤ max − buffer, (max − buffer − L)/buffer up to max, −1 beyond."""
    if buffer <= 0:
        raise ValueError(f"buffer must be > 0, got {buffer}")
    excess_N = (length_N.float() - (max_length - buffer)).clamp(min=0.0)
    return (-excess_N / buffer).clamp(min=-1.0)
