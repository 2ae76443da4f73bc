"""Preference losses over (chosen, rejected) pairs: DPO (Rafailov et al. 2023) with label
smoothing (conservative DPO), IPO (Azar et al. 2023), SimPO (Meng et al. 2024), and
reference-free DPO (log π_ref = 0).

A batch holds pairs interleaved: row 2i is pair i's chosen sequence, row 2i+1 its rejected
one. With s(y) = Σ_t m_t · log π(y_t | x, y_<t) (SimPO: the mask-weighted mean instead) and
Δ(y) = s_θ(y) − s_ref(y):

    sigmoid: z = β·(Δ(y_c) − Δ(y_r));   L = −(1−ε)·log σ(z) − ε·log σ(−z)
    ipo    : h = Δ(y_c) − Δ(y_r);       L = (h − 1/(2β))²        (IPO on summed logprobs;
                                                                   TRL averages them)
    simpo  : z = β·(s̄(y_c) − s̄(y_r)) − γ;  L = −(1−ε)·log σ(z) − ε·log σ(−z)

The step's loss is Σ_pairs L / N_pairs with N_pairs over the global batch, so micro-batch
losses add up under gradient accumulation (as `losses.aggregate_loss` does for GRPO). The
implicit rewards are β·Δ(y) (SimPO: β·s̄(y)).

Shape legend: B = sequences in the micro-batch (2 per pair), P = pairs, T = tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from rlfleet_contracts.preference import DPOConfig
from rlfleet_contracts.recipe import GRPOConfig

from rlfleet_trainer.algorithms.importance import masked_sequence_mean
from rlfleet_trainer.algorithms.losses import LossOutput

TrainLoss = GRPOConfig | DPOConfig
"""What a backend's `train_step` optimises, named by its recipe section: GRPO's policy
loss (`grpo.*`), or a preference loss (`dpo.*`)."""


def sequence_logprobs(
    logprobs_BT: torch.Tensor, mask_BT: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """s_b = Σ_t m_bt · log π_bt, or with `average` Σ_t m·log π / Σ_t m (0 for no tokens)."""
    if average:
        return masked_sequence_mean(logprobs_BT, mask_BT)
    return (logprobs_BT * mask_BT).sum(dim=1)


def _smoothed_sigmoid_loss(z_P: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    loss_P = -F.logsigmoid(z_P) * (1 - label_smoothing)
    if label_smoothing > 0:
        loss_P = loss_P - F.logsigmoid(-z_P) * label_smoothing
    return loss_P


def pair_losses(
    chosen_P: torch.Tensor,
    rejected_P: torch.Tensor,
    ref_chosen_P: torch.Tensor,
    ref_rejected_P: torch.Tensor,
    config: DPOConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(L_P, chosen reward_P, rejected reward_P) from sequence logprobs (module docstring).
    SimPO ignores the reference arguments."""
    beta = config.beta
    if config.loss_type == "simpo":
        z_P = beta * (chosen_P - rejected_P) - config.simpo_gamma
        loss_P = _smoothed_sigmoid_loss(z_P, config.label_smoothing)
        return loss_P, beta * chosen_P.detach(), beta * rejected_P.detach()
    chosen_ratio_P = chosen_P - ref_chosen_P
    rejected_ratio_P = rejected_P - ref_rejected_P
    h_P = chosen_ratio_P - rejected_ratio_P
    if config.loss_type == "sigmoid":
        loss_P = _smoothed_sigmoid_loss(beta * h_P, config.label_smoothing)
    elif config.loss_type == "ipo":
        loss_P = (h_P - 1 / (2 * beta)).square()
    else:  # pragma: no cover - DPOConfig's loss_type refuses it
        raise ValueError(f"unknown dpo loss_type {config.loss_type!r}")
    return loss_P, beta * chosen_ratio_P.detach(), beta * rejected_ratio_P.detach()


def compute_dpo_loss(
    logprobs_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    reference_logprobs_BT: torch.Tensor | None,
    config: DPOConfig,
    global_valid_pairs: float,
) -> LossOutput:
    """The preference loss of one micro-batch of interleaved pairs, normalised by the global
    pair count; a pair with no valid token (rank padding) counts nothing, a pair with one
    empty row (split by slicing) is an error.
    `reference_logprobs_BT` None = reference-free (log π_ref = 0); its knobs are the
    recipe's `dpo.*` section (rlfleet_contracts.preference documents each one)."""
    if logprobs_BT.shape[0] % 2:
        raise ValueError(
            f"a DPO micro-batch holds (chosen, rejected) row pairs; got {logprobs_BT.shape[0]} rows"
        )
    mask_BT = mask_BT.to(logprobs_BT.dtype)
    simpo = config.loss_type == "simpo"  # length-averaged logprobs, no reference
    seq_B = sequence_logprobs(logprobs_BT, mask_BT, average=simpo)
    if reference_logprobs_BT is None or simpo:
        ref_B = torch.zeros_like(seq_B)
    else:
        ref_B = sequence_logprobs(reference_logprobs_BT.to(seq_B), mask_BT, average=False)
    loss_P, chosen_reward_P, rejected_reward_P = pair_losses(
        seq_B[0::2], seq_B[1::2], ref_B[0::2], ref_B[1::2], config
    )
    chosen_valid_P, rejected_valid_P = mask_BT[0::2].sum(1) > 0, mask_BT[1::2].sum(1) > 0
    if bool((chosen_valid_P != rejected_valid_P).any()):
        # A pair split across micro-batches or ranks would otherwise drop out silently.
        row = 2 * int((chosen_valid_P != rejected_valid_P).nonzero()[0, 0])
        raise ValueError(
            f"rows {row} and {row + 1} are not a (chosen, rejected) pair: only one has response "
            "tokens (a pair split by slicing? pairs per step must divide evenly over ranks)"
        )
    valid_P = chosen_valid_P.to(loss_P.dtype)
    n = max(global_valid_pairs, 1.0)
    loss = (loss_P * valid_P).sum() / n

    def pair_mean(values_P: torch.Tensor) -> float:
        return float((values_P.detach().float() * valid_P).sum() / n)

    metrics = {
        "loss": float(loss.detach()),
        "rewards/chosen": pair_mean(chosen_reward_P),
        "rewards/rejected": pair_mean(rejected_reward_P),
        "rewards/margin": pair_mean(chosen_reward_P - rejected_reward_P),
        "rewards/accuracy": pair_mean((chosen_reward_P > rejected_reward_P).float()),
        "logps/chosen": pair_mean(seq_B[0::2]),
        "logps/rejected": pair_mean(seq_B[1::2]),
    }
    return LossOutput(loss=loss, metrics=metrics)
