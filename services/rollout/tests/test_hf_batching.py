"""The hf engine's static batching: requests sent together decode together."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from rlfleet_core.config import load_config
from rlfleet_core.models import resolve_model
from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.hf import HfEngine
from rlfleet_rollout.types import GenerateInput, SamplingConfig

PROMPT = (1, 300, 301, 302, 201)


async def _batch_sizes(batch_wait_ms: float) -> list[int]:
    """Four 2-sample requests sent 1 ms apart to an idle engine; the size of each batch."""
    config = load_config(
        RolloutServiceConfig,
        overrides=["engine=hf", "model=tiny", f"engine_config.batch_wait_ms={batch_wait_ms}"],
    )
    engine = HfEngine(config, resolve_model("tiny"))
    await engine.start()
    sizes: list[int] = []
    run_batch = engine._run_batch

    def recording(rows: list[Any]) -> None:
        sizes.append(len(rows))
        run_batch(rows)

    engine._run_batch = recording  # type: ignore[method-assign]
    sampling = SamplingConfig(max_tokens=8, ignore_eos=True, seed=1)

    async def one(i: int) -> int:
        await asyncio.sleep(0.001 * i)
        request = GenerateInput(f"r{i}", PROMPT, 2, sampling)
        return len([s async for s in engine.generate(request)])

    try:
        assert await asyncio.gather(*(one(i) for i in range(4))) == [2, 2, 2, 2]
    finally:
        await engine.stop()
    return sizes


@pytest.mark.asyncio
async def test_requests_sent_together_share_one_batch() -> None:
    assert await _batch_sizes(batch_wait_ms=200.0) == [8]


@pytest.mark.asyncio
async def test_without_the_wait_the_first_request_decodes_alone() -> None:
    # What batch_wait_ms fixes (the GPU grpo bench saw sync generation take 2x as long).
    sizes = await _batch_sizes(batch_wait_ms=0.0)
    assert sizes[0] == 2 and sum(sizes) == 8, sizes
