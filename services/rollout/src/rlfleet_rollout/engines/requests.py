"""Request preparation shared by the engines: the per-sample sampling parameters and how
many tokens a sample may generate."""

from __future__ import annotations

from rlfleet_rollout.types import GenerateInput, SamplingConfig


def sample_sampling(request: GenerateInput, index: int) -> SamplingConfig:
    """Sampling parameters of sample `index` (a seeded request gives sample i seed + i)."""
    return request.sampling.for_sample(index)


def token_budget(sampling: SamplingConfig, prompt_len: int, max_model_len: int) -> int:
    """New tokens a sample may generate: its max_tokens, capped by the context left."""
    return min(sampling.max_tokens, max_model_len - prompt_len)
