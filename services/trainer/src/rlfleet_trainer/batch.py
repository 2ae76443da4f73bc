"""From scored trajectories to the padded tensors a policy backend trains on.

A `Trajectory` is one sample (prompt ids, generated ids, the sampler's logprobs, reward,
weight version); a `TrainBatch` stacks N of them. Token tensors are aligned to
*predictions*: position t holds the logprob of token t+1 of the full sequence, so their
width is T = L − 1 and `mask_NT` is 1 exactly on generated tokens (times the sample's loss
multiplier).

Shape legend: N = samples, L = padded prompt+response length, T = L − 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Trajectory:
    """One generated sample with everything the loss needs."""

    prompt_id: str
    """Stable id of the data row (the ledger's key)."""
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    generation_logprobs: list[float]
    truncated: bool
    """Finished by length, not EOS (overlong filtering applies)."""
    reward: float = 0.0
    reward_masked: bool = False
    """The reward asked for no gradient on this sample (NeMo-Gym mask_sample)."""
    env: str = ""
    weight_version: int = 0
    """Oldest weight version the sample was (partly) generated under."""
    advantage: float = 0.0


@dataclass
class TrainBatch:
    input_ids_NL: torch.Tensor
    attention_mask_NL: torch.Tensor
    mask_NT: torch.Tensor
    """1.0 on generated tokens × the sample's loss multiplier; 0 on prompt and padding."""
    generation_logprobs_NT: torch.Tensor
    advantages_N: torch.Tensor
    prev_logprobs_NT: torch.Tensor | None = None
    reference_logprobs_NT: torch.Tensor | None = None
    weight_versions_N: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    response_start: int = 0
    """First prediction position (T index) that predicts a generated token in any sample:
    backends may skip the LM head before it (the prompt's logits are never used)."""

    @property
    def size(self) -> int:
        return int(self.input_ids_NL.shape[0])

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens (for tokens/s)."""
        return int(self.attention_mask_NL.sum())

    def global_valid_tokens(self) -> float:
        return float(self.mask_NT.sum())

    def global_valid_sequences(self) -> float:
        return float((self.mask_NT.sum(dim=1) > 0).sum())

    def slice(self, start: int, stop: int) -> TrainBatch:
        """Samples [start, stop), trimmed to their longest sequence."""
        length = int(self.attention_mask_NL[start:stop].sum(dim=1).max())

        def cut(t: torch.Tensor | None, width: int) -> torch.Tensor | None:
            return None if t is None else t[start:stop, :width]

        return TrainBatch(
            input_ids_NL=self.input_ids_NL[start:stop, :length],
            attention_mask_NL=self.attention_mask_NL[start:stop, :length],
            mask_NT=self.mask_NT[start:stop, : length - 1],
            generation_logprobs_NT=self.generation_logprobs_NT[start:stop, : length - 1],
            advantages_N=self.advantages_N[start:stop],
            prev_logprobs_NT=cut(self.prev_logprobs_NT, length - 1),
            reference_logprobs_NT=cut(self.reference_logprobs_NT, length - 1),
            weight_versions_N=self.weight_versions_N[start:stop],
            response_start=min(self.response_start, length - 1),
        )


def build_train_batch(
    trajectories: Sequence[Trajectory], loss_multipliers_N: torch.Tensor, pad_token_id: int = 0
) -> TrainBatch:
    """Right-pad prompt+response ids; put each generated token's sampler logprob at the
    position that predicts it (prompt length − 1 + k for the k-th generated token)."""
    if not trajectories:
        raise ValueError("cannot build a batch from no trajectories")
    lengths = [len(t.prompt_token_ids) + len(t.token_ids) for t in trajectories]
    n, width = len(trajectories), max(lengths)
    input_ids_NL = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask_NL = torch.zeros((n, width), dtype=torch.long)
    mask_NT = torch.zeros((n, width - 1), dtype=torch.float32)
    generation_logprobs_NT = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        if len(traj.generation_logprobs) != len(traj.token_ids):
            raise ValueError(
                f"trajectory {traj.prompt_id}/{traj.sample_index}: {len(traj.token_ids)} tokens "
                f"but {len(traj.generation_logprobs)} logprobs"
            )
        ids = traj.prompt_token_ids + traj.token_ids
        input_ids_NL[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask_NL[i, : len(ids)] = 1
        start = len(traj.prompt_token_ids) - 1
        stop = start + len(traj.token_ids)
        mask_NT[i, start:stop] = float(loss_multipliers_N[i])
        generation_logprobs_NT[i, start:stop] = torch.tensor(traj.generation_logprobs)
    return TrainBatch(
        input_ids_NL=input_ids_NL,
        attention_mask_NL=attention_mask_NL,
        mask_NT=mask_NT,
        generation_logprobs_NT=generation_logprobs_NT,
        advantages_N=torch.tensor([t.advantage for t in trajectories], dtype=torch.float32),
        weight_versions_N=torch.tensor([t.weight_version for t in trajectories]),
        response_start=min(len(t.prompt_token_ids) for t in trajectories) - 1,
    )
