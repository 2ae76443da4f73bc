"""Group-relative advantages (GRPO, Shao et al. 2024) with the leave-one-out baseline
(RLOO, Ahmadian et al. 2024), as NeMo-RL computes them.

Shape legend: P = prompt groups, G = generations per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ADVANTAGE_EPS = 1e-6
"""Added to the std before dividing (NeMo-RL's epsilon)."""


def compute_baseline_and_std(
    rewards_PG: torch.Tensor, leave_one_out: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample baseline and std of a group's rewards.

    Leave-one-out (n = G - 1 other samples):
        b_i   = (Σ_j r_j − r_i) / n
        std_i = sqrt(Σ_{j≠i} (r_j − b_i)² / (n − 1))      (Bessel-corrected)
    Plain (n = G): the group mean and the Bessel-corrected std of all G rewards.
    A std that is undefined (n = 1) or only rounding noise is 0.

    Returns (baseline_PG, std_PG).
    """
    if rewards_PG.dim() != 2 or rewards_PG.shape[1] < 2:
        raise ValueError(f"rewards must be [prompts, G >= 2], got shape {tuple(rewards_PG.shape)}")
    rewards_PG = rewards_PG.double()
    group_size = rewards_PG.shape[1]
    # Squared deviations are summed directly (two passes), not from Σr² − n·b²: that
    # moment form cancels catastrophically when the other rewards are equal up to
    # rounding (2/3 vs 1/3 + 1/3), leaving a std of ~1e-8 that turned a 0.33 reward
    # gap into an advantage of 3e5.
    if leave_one_out:
        n = group_size - 1
        baseline_PG = (rewards_PG.sum(dim=1, keepdim=True) - rewards_PG) / n
        others_GG = ~torch.eye(group_size, dtype=torch.bool, device=rewards_PG.device)
        # deviation_PGG[p, i, j] = r_j − b_i over the others j ≠ i of sample i
        deviation_PGG = rewards_PG.unsqueeze(1) - baseline_PG.unsqueeze(2)
        squares_PG = (deviation_PGG.square() * others_GG).sum(dim=2)
    else:
        n = group_size
        baseline_PG = rewards_PG.mean(dim=1, keepdim=True).expand_as(rewards_PG)
        squares_PG = (
            (rewards_PG - baseline_PG).square().sum(dim=1, keepdim=True).expand_as(rewards_PG)
        )
    # Bessel: divide by n − 1; one other sample leaves no spread to estimate.
    std_PG = (squares_PG / (n - 1)).sqrt() if n > 1 else torch.zeros_like(rewards_PG)
    # Rewards equal up to rounding leave a std far below any real spread: treat as 0.
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


def normalize_advantages_per_env(advantages_N: torch.Tensor, env_N: Sequence[str]) -> torch.Tensor:
    """Per-environment batch normalisation of a mixed batch: each environment's advantages
    divided by their std over the batch, A_i / (std_e + 1e−6) (Bessel-corrected; an
    environment whose advantages are all 0, or that has one sample, is left as is).

    GRPO's advantage is already relative to its own group (one prompt, one environment),
    so no environment's mean leaks into another's. What remains is scale: without
    `normalize_rewards` (Dr. GRPO) an environment with a wide reward range or spread
    outweighs one with a narrow range (graded instruction following against 0/1 math); this
    gives each environment unit advantage scale in every step. With `normalize_rewards` each
    informative group already has unit scale, and this only up-weights environments with
    many zero-variance groups. NeMo-RL has no per-task normalisation (only the per-prompt
    std and a global `reward_scaling`), so it is off by default.

    Returns advantages_N (float32).
    """
    if advantages_N.dim() != 1 or advantages_N.shape[0] != len(env_N):
        raise ValueError(
            f"advantages must be [N] with one env per sample, got shape "
            f"{tuple(advantages_N.shape)} and {len(env_N)} envs"
        )
    out_N = advantages_N.double().clone()
    for env in sorted(set(env_N)):
        mask_N = torch.tensor([e == env for e in env_N], device=advantages_N.device)
        if int(mask_N.sum()) < 2:
            continue
        std = float(out_N[mask_N].std())
        if std > 1e-12:
            out_N[mask_N] = out_N[mask_N] / (std + ADVANTAGE_EPS)
    return out_N.float()


REWARD_TIE = 1e-9
"""Rewards closer than this are equal (graded rewards summed in different orders differ
in the last bits)."""


def zero_variance_groups(rewards_PG: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling (DAPO): True for groups whose rewards are all equal; they carry
    no learning signal (every advantage is 0) and are dropped. Returns mask_P (bool)."""
    return (rewards_PG.max(dim=1).values - rewards_PG.min(dim=1).values) <= REWARD_TIE
