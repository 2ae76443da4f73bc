"""What one answer costs each environment's `score`, in this process: the numbers behind each
environment's default placement (loop / thread / process, docs/reward.md).

The answers are the service tests' table cases (services/reward/tests/cases.py: correct,
equivalent, wrong and malformed answers per environment), each scored `REPS` times after a
warm-up, so caches that a long-running verifier keeps (compiled schemas, parsed gold
answers) are warm as they are in service. `p99` is over cases, so one costly case shows.
The baseline of every row is what the worker pool adds to one answer at concurrency 1
(the round trip of a job through a one-worker pool, minus its score): a check far
cheaper than that belongs inline. Environments that override `run` (code, low_effort) do not place a `score` and are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

from rlfleet_core.bench import BenchResult, percentile
from rlfleet_reward.environments import ENVIRONMENT_NAMES, get_environment
from rlfleet_reward.environments.base import Environment
from rlfleet_reward.types import RowError, Sample

DESCRIPTION = "cost of one answer per environment's score (placement evidence)"
REPS = 20


def _cases() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[1] / "services/reward/tests/cases.py"
    spec = importlib.util.spec_from_file_location("rlfleet_bench_reward_cases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cases: dict[str, Any] = module.ALL_CASES
    return cases


def cost_ms(env_name: str, cases: list[Any], reps: int) -> list[float]:
    """Mean ms per answer of each case that parses."""
    env = get_environment(env_name)
    costs = []
    for case in cases:
        if isinstance(case.row, str):
            continue
        with contextlib.suppress(RowError, ValueError, TypeError):
            spec = env.parse_row(case.row)
            sample = Sample(case.text, num_tokens=case.num_tokens or 1)
            with contextlib.suppress(Exception):
                env.score(spec, sample)  # warm
            start = time.perf_counter()
            for _ in range(reps):
                with contextlib.suppress(Exception):
                    env.score(spec, sample)
            costs.append((time.perf_counter() - start) / reps * 1e3)
    return costs


async def _pool_round_trip_ms(n: int) -> float:
    """Mean ms a trivial mcqa job spends in a one-worker VerifierPool, beyond its score."""
    from rlfleet_reward.pool import VerifierPool

    env = get_environment("mcqa")
    spec = env.parse_row({"options": [{"A": "x"}, {"B": "y"}], "expected_answer": "A"})
    sample = Sample("Answer: A")
    start = time.perf_counter()
    for _ in range(n):
        env.score(spec, sample)
    own_ms = (time.perf_counter() - start) / n * 1e3
    pool = VerifierPool(
        1,
        max_queue=16,
        kill_grace_s=1.0,
        env_names=["mcqa"],
        preload_modules=[type(env).__module__],
    )
    await pool.start()
    try:
        for _ in range(10):
            await pool.submit("mcqa", spec, sample, 10.0)
        start = time.perf_counter()
        for _ in range(n):
            await pool.submit("mcqa", spec, sample, 10.0)
        return (time.perf_counter() - start) / n * 1e3 - own_ms
    finally:
        await pool.stop()


def run(quick: bool = False) -> list[BenchResult]:
    reps = 3 if quick else REPS
    round_trip_ms = asyncio.run(_pool_round_trip_ms(50 if quick else 500))
    results = []
    for env_name, cases in _cases().items():
        if env_name not in ENVIRONMENT_NAMES:
            continue
        env = get_environment(env_name)
        if type(env).run is not Environment.run:
            continue
        costs = cost_ms(env_name, cases, reps)
        extra = {
            "env": env_name,
            "placement": env.placement,
            "cases": len(costs),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        for q in (50, 99):
            results.append(
                BenchResult(
                    "reward-costs",
                    f"p{q}_ms_{env_name}",
                    percentile(costs, q),
                    "ms",
                    round_trip_ms,
                    higher_is_better=False,
                    extra=extra,
                )
            )
        results.append(
            BenchResult(
                "reward-costs",
                f"max_ms_{env_name}",
                max(costs),
                "ms",
                round_trip_ms,
                higher_is_better=False,
                extra=extra,
            )
        )
    return results
