"""Group-relative advantages (GRPO, Shao et al. 2024) with the leave-one-out baseline
(RLOO, Ahmadian et al. 2024), as NeMo-RL computes them.

Shape legend: P = prompt groups, G = generations per prompt.
"""

from __future__ import annotations

import torch

ADVANTAGE_EPS = 1e-6
"""Added to the std before dividing (NeMo-RL's epsilon)."""


def compute_baseline_and_std(
    rewards_PG: torch.Tensor, leave_one_out: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and std of a group's rewards.

    Leave-one-out (n = G - 1 other samples):
        b_i   = (Σ_j r_j − r_i) / n
        m2_i  = (Σ_j r_j² − r_i²) / n
        std_i = sqrt((m2_i − b_i²) · n / (n − 1))        (Bessel-corrected)
    Plain (n = G): the group mean and the Bessel-corrected std of all G rewards.
    A std that is undefined (n = 1) or tiny negative from rounding is 0.

    Returns (baseline_PG, std_PG).
    """
    if rewards_PG.dim() != 2 or rewards_PG.shape[1] < 2:
        raise ValueError(f"rewards must be [prompts, G >= 2], got shape {tuple(rewards_PG.shape)}")
    rewards_PG = rewards_PG.double()
    group_size = rewards_PG.shape[1]
    total_P1 = rewards_PG.sum(dim=1, keepdim=True)
    total_sq_P1 = rewards_PG.square().sum(dim=1, keepdim=True)
    if leave_one_out:
        n = group_size - 1
        baseline_PG = (total_P1 - rewards_PG) / n
        second_moment_PG = (total_sq_P1 - rewards_PG.square()) / n
    else:
        n = group_size
        baseline_PG = (total_P1 / n).expand_as(rewards_PG)
        second_moment_PG = (total_sq_P1 / n).expand_as(rewards_PG)
    variance_PG = (second_moment_PG - baseline_PG.square()).clamp(min=0.0)
    bessel = n / (n - 1) if n > 1 else 0.0  # one other sample: no spread to estimate
    std_PG = (variance_PG * bessel).sqrt()
    # Rounding can leave ~1e-17 where the others are all equal; treat that as 0.
    std_PG = torch.where(std_PG < 1e-12, torch.zeros_like(std_PG), std_PG)
    return baseline_PG, std_PG


def compute_grpo_advantages(
    rewards_PG: torch.Tensor,
    *,
    leave_one_out: bool = True,
    normalize: bool = True,
    clip: float | None = None,
) -> torch.Tensor:
    """A_i = (r_i − b_i) / (std_i + 1e−6) where std_i > 0; where std_i = 0 the
    advantage is left as r_i − b_i (NeMo-RL: "don't sharpen the ones with no variation").
    With `normalize=False`, A_i = r_i − b_i. With `clip=c`, A is clamped to [−c, c].

    Returns advantages_PG (float32).
    """
    baseline_PG, std_PG = compute_baseline_and_std(rewards_PG, leave_one_out)
    advantages_PG = rewards_PG.double() - baseline_PG
    if normalize:
        advantages_PG = torch.where(
            std_PG > 0, advantages_PG / (std_PG + ADVANTAGE_EPS), advantages_PG
        )
    if clip is not None:
        advantages_PG = advantages_PG.clamp(-clip, clip)
    return advantages_PG.float()


def zero_variance_groups(rewards_PG: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling (DAPO): True for groups whose rewards are all equal; they carry
    no learning signal (every advantage is 0) and are dropped. Returns mask_P (bool)."""
    return (rewards_PG.max(dim=1).values - rewards_PG.min(dim=1).values) == 0
