"""KL penalty estimators against a frozen reference policy (Schulman, "Approximating KL
divergence", 2020), with NeMo-RL's input and output clamps.

Shape legend: B = sequences in the micro-batch, T = response tokens (padded).
"""

from __future__ import annotations

from typing import Literal

import torch

KLType = Literal["k1", "k2", "k3"]
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3")


def compute_kl(
    logprobs_BT: torch.Tensor,
    ref_logprobs_BT: torch.Tensor,
    kl_type: str = "k3",
    input_clamp: float | None = 20.0,
    output_clamp: float | None = 10.0,
) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate from samples of π_θ.

    With log r = log π_ref − log π_θ, clamped to [−input_clamp, input_clamp]:
        k1 = −log r
        k2 = (log r)² / 2
        k3 = exp(log r) − 1 − log r          (unbiased, always ≥ 0)
    and the result clamped to [−output_clamp, output_clamp].
    """
    log_ratio_BT = ref_logprobs_BT - logprobs_BT
    if input_clamp is not None:
        log_ratio_BT = log_ratio_BT.clamp(-input_clamp, input_clamp)
    if kl_type == "k1":
        kl_BT = -log_ratio_BT
    elif kl_type == "k2":
        kl_BT = log_ratio_BT.square() / 2
    elif kl_type == "k3":
        kl_BT = log_ratio_BT.exp() - 1 - log_ratio_BT
    else:
        raise ValueError(f"unknown kl_type {kl_type!r}; valid: {', '.join(KL_TYPES)}")
    if output_clamp is not None:
        kl_BT = kl_BT.clamp(-output_clamp, output_clamp)
    return kl_BT
