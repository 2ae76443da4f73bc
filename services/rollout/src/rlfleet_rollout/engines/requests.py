"""Request preparation shared by the engines: the per-sample sampling parameters, how
many tokens a sample may generate, left-padded batches of token ids."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlfleet_rollout.types import GenerateInput, SamplingConfig


def sample_sampling(request: GenerateInput, index: int) -> SamplingConfig:
    """Sampling parameters of sample `index` (a seeded request gives sample i seed + i)."""
    return request.sampling.for_sample(index)


def token_budget(sampling: SamplingConfig, prompt_len: int, max_model_len: int) -> int:
    """New tokens a sample may generate: its max_tokens, capped by the context left."""
    return min(sampling.max_tokens, max_model_len - prompt_len)


def left_padded(seqs: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [N, longest] left-padded with `pad`, and the attention mask (1 = token)."""
    width = max(len(seq) for seq in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, seq in enumerate(seqs):
        ids[b, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[b, width - len(seq) :] = 1
    return ids, mask
