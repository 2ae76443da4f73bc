"""The hf engine's prefix cache (engines/hf_prefix.py): a later prompt that starts with an
earlier sample's tokens is prefilled only past them, and gives what a full prefill gives."""

from __future__ import annotations

import asyncio

import pytest
import torch
from rlfleet_core.config import load_config
from rlfleet_core.models import resolve_model
from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.hf import HfEngine
from rlfleet_rollout.engines.hf_prefix import MIN_REUSE, PrefixCache
from rlfleet_rollout.types import FinishReason, GenerateInput, Sample, SamplingConfig

FIRST = tuple(range(300, 340))
"""A 40-token first turn."""


def _kv(n: int, fill: float = 0.0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two layers of [2 heads, n tokens, 4] keys and values."""
    return [torch.full((2, n, 4), fill) for _ in range(2)], [
        torch.full((2, n, 4), fill) for _ in range(2)
    ]


def test_lookup_finds_the_longest_common_prefix_and_leaves_a_token_to_prefill() -> None:
    cache = PrefixCache(1 << 20)
    cache.store(list(range(100, 130)), *_kv(30, 1.0), version=0)
    cache.store(list(range(100, 150)), *_kv(50, 2.0), version=0)  # extends the first: replaces it
    assert len(cache) == 1
    hit = cache.lookup([*range(100, 140), 7, 8], version=0)
    assert hit.length == 40 and hit.entry is not None and float(hit.entry.keys[0][0, 0, 0]) == 2.0
    # The whole prompt held: the last token is still prefilled (its logits start the sample).
    assert cache.lookup(list(range(100, 150)), version=0).length == 49
    # Too short a common prefix is not worth a copy.
    assert cache.lookup([*range(100, 100 + MIN_REUSE - 1), 1, 2, 3], version=0).entry is None
    assert cache.lookup([5, *range(100, 150)], version=0).entry is None


def test_new_weights_empty_the_cache_and_old_samples_are_not_stored() -> None:
    cache = PrefixCache(1 << 20)
    cache.store(list(range(100, 150)), *_kv(50), version=3)
    assert cache.lookup(list(range(100, 160)), version=4).entry is None
    assert len(cache) == 0
    cache.store(list(range(100, 150)), *_kv(50), version=3)  # computed under older weights
    assert len(cache) == 0


def test_the_least_recently_used_entry_goes_when_memory_runs_out() -> None:
    one = sum(t.numel() * 4 for t in (*_kv(50)[0], *_kv(50)[1]))
    cache = PrefixCache(2 * one)
    a, b, c = (list(range(start, start + 50)) for start in (1000, 2000, 3000))
    cache.store(a, *_kv(50), version=0)
    cache.store(b, *_kv(50), version=0)
    assert cache.lookup([*a, 1], version=0).entry is not None  # a is now the most recent
    cache.store(c, *_kv(50), version=0)
    assert len(cache) == 2 and cache.bytes == 2 * one
    assert cache.lookup([*b, 1], version=0).entry is None
    assert cache.lookup([*a, 1], version=0).entry is not None
    PrefixCache(one - 1).store(a, *_kv(50), version=0)  # larger than the budget: not held


def _engine(*overrides: str) -> HfEngine:
    config = load_config(
        RolloutServiceConfig,
        overrides=["engine=hf", "model=tiny", "engine_config.batch_wait_ms=50", *overrides],
    )
    return HfEngine(config, resolve_model("tiny"))


async def _turns(engine: HfEngine) -> tuple[list[Sample], list[Sample]]:
    """A first turn, then (one batch) its continuation, a prompt sharing only part of it,
    and a long unrelated prompt: prefills of very different lengths, joined in one batch."""
    greedy = SamplingConfig(max_tokens=6, temperature=0.0, ignore_eos=True, top_logprobs=2)
    first = [s async for s in engine.generate(GenerateInput("t1", FIRST, 1, greedy))]
    seen = [*FIRST, *first[0].token_ids[:-1]]
    prompts = {
        "next-turn": (*seen, first[0].token_ids[-1], 11, 12, 13),
        "shared-start": (*FIRST[:24], 20, 21),
        "unrelated": tuple(range(100, 190)),
    }

    async def one(name: str, prompt: tuple[int, ...]) -> Sample:
        (sample,) = [s async for s in engine.generate(GenerateInput(name, prompt, 1, greedy))]
        return sample

    second = await asyncio.gather(*(one(n, p) for n, p in prompts.items()))
    return first, list(second)


@pytest.mark.asyncio
async def test_a_prompt_continued_from_the_cache_matches_a_full_prefill() -> None:
    cached, plain = _engine(), _engine("engine_config.enable_prefix_caching=false")
    # One after the other: transformers' lazy import is not safe from two threads at once.
    await cached.start()
    await plain.start()
    try:
        got_first, got = await _turns(cached)
        want_first, want = await _turns(plain)
    finally:
        await asyncio.gather(cached.stop(), plain.stop())
    assert cached._prefix is not None and plain._prefix is None
    # next-turn reused the first turn's 45 fed tokens, shared-start its first 24.
    assert cached._prefix.reused_tokens == 45 + 24, cached._prefix.reused_tokens
    for g, w in zip([*got_first, *got], [*want_first, *want], strict=True):
        assert g.finish_reason == FinishReason.LENGTH and len(g.token_ids) == 6, g
        assert g.token_ids == w.token_ids, (g.request_id, g.token_ids, w.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4)
