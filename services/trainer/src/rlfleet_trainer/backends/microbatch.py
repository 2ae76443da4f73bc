"""What both policy backends do the same way around their forward passes: slicing a batch
into micro-batches, filling [N, T] logprobs micro-batch by micro-batch, the policy loss of
one micro-batch (GRPO's or, for a `DPOConfig`, the preference loss over interleaved
pairs) with its metrics summed over the step, the global normalisers, and the warm-up
schedule.

Shape legend: N = samples, L = sequence length, T = L − 1, V = vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from rlfleet_contracts.preference import DPOConfig

from rlfleet_trainer.algorithms.dpo import TrainLoss, compute_dpo_loss
from rlfleet_trainer.algorithms.losses import LossInputs, compute_policy_loss
from rlfleet_trainer.batch import TrainBatch


def micro_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    return [
        batch.slice(start, min(start + size, batch.size)) for start in range(0, batch.size, size)
    ]


def train_micro_batches(batch: TrainBatch, size: int, loss_config: TrainLoss) -> list[TrainBatch]:
    """The step's micro-batches; a preference loss needs both rows of a pair in the same
    micro-batch, so its size is rounded up to even."""
    if isinstance(loss_config, DPOConfig):
        size += size % 2
    return micro_batches(batch, size)


def score_micro_batches(
    batch: TrainBatch, size: int, score: Callable[[TrainBatch], torch.Tensor | None]
) -> torch.Tensor:
    """[N, T] logprobs of `batch`, `score(part)` per micro-batch of `size` samples (None:
    this rank computes no logprobs, e.g. a pipeline stage before the last); 0 elsewhere."""
    out_NT = torch.zeros_like(batch.generation_logprobs_NT)
    start = 0
    for part in micro_batches(batch, size):
        logprobs_NT = score(part)
        if logprobs_NT is not None:
            out_NT[start : start + part.size, : logprobs_NT.shape[1]] = logprobs_NT.float().cpu()
        start += part.size
    return out_NT


def global_counts(
    batch: TrainBatch, device: torch.device, group: Any = None, reduce: bool = True
) -> tuple[float, float]:
    """Valid tokens and sequences of the *global* batch (the loss's normalisers), summed
    over `group` when each rank holds a slice of it."""
    counts = torch.tensor(
        [batch.global_valid_tokens(), batch.global_valid_sequences()],
        dtype=torch.float64,
        device=device,  # NCCL reduces device tensors only
    )
    if reduce:
        dist.all_reduce(counts, group=group)
    return float(counts[0]), float(counts[1])


def micro_batch_loss(
    part: TrainBatch,
    logprobs_NT: torch.Tensor,
    entropy_NT: torch.Tensor,
    loss_config: TrainLoss,
    counts: tuple[float, float],
    metrics: dict[str, float],
) -> torch.Tensor:
    """The loss of one micro-batch (normalised by the global `counts`); its metrics are
    added into `metrics`, so they sum over the step's micro-batches. A preference loss
    takes the pairs' reference logprobs from `reference_logprobs_NT` (None: reference-free)
    and counts a pair as two valid sequences."""
    device = logprobs_NT.device
    if isinstance(loss_config, DPOConfig):
        out = compute_dpo_loss(
            logprobs_NT,
            part.mask_NT.to(device),
            _to(part.reference_logprobs_NT, device),
            loss_config,
            counts[1] / 2,
        )
    else:
        out = compute_policy_loss(
            LossInputs(
                logprobs_BT=logprobs_NT,
                generation_logprobs_BT=part.generation_logprobs_NT.to(device),
                advantages_B=part.advantages_N.to(device),
                mask_BT=part.mask_NT.to(device),
                prev_logprobs_BT=_to(part.prev_logprobs_NT, device),
                reference_logprobs_BT=_to(part.reference_logprobs_NT, device),
                entropy_BT=entropy_NT,
            ),
            loss_config,
            counts[0],
            counts[1],
        )
    for key, value in out.metrics.items():
        metrics[key] = metrics.get(key, 0.0) + value
    return out.loss


def token_logprobs_and_entropy(
    logits_NTV: torch.Tensor, targets_NT: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(z/τ)[target] and the entropy −Σ p log p of softmax(z/τ), in float32."""
    logits_NTV = logits_NTV.float()
    if temperature != 1.0:
        logits_NTV = logits_NTV / temperature
    log_probs_NTV = torch.log_softmax(logits_NTV, dim=-1)
    logprobs_NT = log_probs_NTV.gather(-1, targets_NT.unsqueeze(-1)).squeeze(-1)
    entropy_NT = -(log_probs_NTV.exp() * log_probs_NTV).sum(dim=-1)
    return logprobs_NT, entropy_NT


def linear_warmup(warmup_steps: int) -> Callable[[int], float]:
    """LambdaLR factor: the learning rate rises linearly over `warmup_steps` steps."""

    def factor(step: int) -> float:
        return 1.0 if warmup_steps == 0 else min(1.0, (step + 1) / warmup_steps)

    return factor


def _to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device)
