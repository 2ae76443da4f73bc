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


@pytest.mark.parametrize(("batch_wait_ms", "waits"), [(0.0, 0), (200.0, 1)])
def test_without_the_wait_the_first_request_decodes_alone(batch_wait_ms: float, waits: int) -> None:
    """What batch_wait_ms fixes (the GPU grpo bench saw sync generation take 2x as long):
    with no wait a batch starts with whatever is pending, so of requests sent a millisecond
    apart the first decodes alone; with a wait the engine waits (here until the batch is
    full). Checked on the gathering step itself: end to end, a loaded machine may deliver
    all four requests before the engine's thread runs (one CI run saw [8] at wait 0)."""
    config = load_config(
        RolloutServiceConfig,
        overrides=[
            "engine=hf", "model=tiny", f"engine_config.batch_wait_ms={batch_wait_ms}",
            "engine_config.max_num_seqs=2",
        ],
    )  # fmt: skip
    engine = HfEngine(config, resolve_model("tiny"))
    seen: list[float] = []

    class Condition:  # stands in for the engine's; a second request arrives during a wait
        def wait(self, timeout: float) -> None:
            seen.append(timeout)
            engine._pending.append(object())  # type: ignore[arg-type]

    engine._cond = Condition()  # type: ignore[assignment]
    engine._pending = [object()]  # type: ignore[list-item]
    engine._gather_pending()
    assert len(seen) == waits and all(0 < t <= batch_wait_ms / 1000 for t in seen), seen
    assert len(engine._pending) == 1 + waits


@pytest.mark.asyncio
async def test_a_shared_prompt_is_prefilled_once_and_samples_as_if_alone() -> None:
    """A group's samples share their prompt: the prefill runs over the distinct prompts
    only, and every sample draws what it draws when it is decoded on its own."""
    from dataclasses import replace

    config = load_config(
        RolloutServiceConfig,
        overrides=["engine=hf", "model=tiny", "engine_config.batch_wait_ms=200"],
    )
    engine = HfEngine(config, resolve_model("tiny"))
    await engine.start()
    prefilled: list[int] = []
    forward = engine._forward  # the prefill's forward pass (decode steps call the model)

    def recording(ids: Any, mask: Any, positions: Any, past: Any) -> Any:
        prefilled.append(int(ids.shape[0]))
        return forward(ids, mask, positions, past)

    engine._forward = recording  # type: ignore[method-assign]
    sampling = SamplingConfig(max_tokens=8, ignore_eos=True, temperature=1.0, seed=7)
    other = (1, 400, 401, 201)  # shorter: its row is left-padded in the shared batch

    async def run(request: GenerateInput) -> list[tuple[list[int], list[float]]]:
        samples = sorted([s async for s in engine.generate(request)], key=lambda s: s.index)
        return [(s.token_ids, s.logprobs) for s in samples]

    try:
        group, single = await asyncio.gather(
            run(GenerateInput("group", PROMPT, 3, sampling)),
            run(GenerateInput("other", other, 1, replace(sampling, seed=99))),
        )
        assert prefilled == [2]  # four rows, two distinct prompts
        alone = [
            (await run(GenerateInput(f"alone{i}", PROMPT, 1, replace(sampling, seed=7 + i))))[0]
            for i in range(3)
        ]
        alone_other = (
            await run(GenerateInput("other-alone", other, 1, replace(sampling, seed=99)))
        )[0]
    finally:
        await engine.stop()
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(
        [*group, *single], [*alone, alone_other], strict=True
    ):
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-4)
    assert len({tuple(t) for t, _ in group}) > 1  # the samples did differ (temperature 1)
