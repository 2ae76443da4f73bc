"""Dispatch to verifier workers never blocks the gateway's event loop: jobs and results
larger than a socket buffer, queued behind a slow job, neither stall /healthz nor
deadlock gateway and worker, and SIGTERM stops the service while they are in flight."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import httpx
from grpc import aio
from reward_support import (
    TEST_ENVS,
    RewardServer,
    score_request,
    start_reward_server,
    stop_reward_server,
)
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.types import FailureKind

_CHARS = 1_000_000  # under limits.max_response_chars, far over a socket buffer


def _one_worker_server(tmp: Path) -> RewardServer:
    # One worker: every job queues behind the one before it in that worker's pipe.
    return start_reward_server(
        tmp,
        ["pool.workers=1", "pool.kill_grace_s=0.5", f"extra_environments={TEST_ENVS}"],
    )


async def _probe_health(url: str, stop: asyncio.Event) -> list[float]:
    """Seconds each /healthz took, probing every 50 ms until `stop` (5 s limit per probe)."""
    latencies = []
    async with httpx.AsyncClient(timeout=5.0) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                reply = await client.get(f"{url}/healthz")
                assert reply.status_code == 200, reply.text
                latencies.append(time.perf_counter() - start)
            except httpx.TimeoutException:
                latencies.append(float("inf"))
            await asyncio.sleep(0.05)
    return latencies


async def _score_all(
    target: str, texts: list[str], timeout_s: float
) -> list[tuple[reward_pb2.ScoreResult, float]]:
    async with aio.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def one(text: str, delay_s: float) -> tuple[reward_pb2.ScoreResult, float]:
            await asyncio.sleep(delay_s)  # keep the order in which they reach the worker
            start = time.perf_counter()
            result = await stub.Score(score_request("big", {}, text), timeout=timeout_s)
            return result, time.perf_counter() - start

        return await asyncio.gather(*(one(t, 0.2 * i) for i, t in enumerate(texts)))


async def test_large_jobs_and_results_do_not_stall_or_deadlock(tmp_path: Path) -> None:
    server = _one_worker_server(tmp_path)
    try:
        # A slow job, then 1 MB answers whose results (~1.6 MB pickled) also exceed a
        # socket buffer. Before: the gateway blocked in write() on the next job while the
        # worker blocked in write() on its result — health froze for good.
        texts = ["slow 3 " + "x" * _CHARS, *(["y" * _CHARS] * 3)]
        stop = asyncio.Event()
        probe = asyncio.create_task(_probe_health(server.http_url, stop))
        results = await _score_all(server.grpc_target, texts, timeout_s=30.0)
        stop.set()
        latencies = await probe
        for result, elapsed_s in results:
            assert result.failure_kind == FailureKind.NONE.value, result.failure_reason
            assert len(result.reward_components) >= _CHARS // 16
            assert elapsed_s < 30.0
        # Liveness, not speed: a frozen loop showed here as >= 3 s or a timeout.
        assert max(latencies) < 2.0, sorted(latencies)[-5:]
    finally:
        assert stop_reward_server(server) == 0, server.log()


async def test_sigterm_stops_promptly_with_large_jobs_in_flight(tmp_path: Path) -> None:
    server = _one_worker_server(tmp_path)
    # The first job's result and the jobs queued behind it exceed a socket buffer: the old
    # pool deadlocked ~3 s in, and its blocked loop never ran the SIGTERM handler. The
    # last job is still running in the worker when SIGTERM comes.
    texts = ["slow 3 " + "x" * _CHARS, *(["y" * _CHARS] * 3), "slow 20"]
    calls = asyncio.create_task(_score_all(server.grpc_target, texts, timeout_s=60.0))
    await asyncio.sleep(6.0)
    server.process.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.to_thread(server.process.wait, 15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        raise AssertionError(f"SIGTERM did not stop the service in 15 s:\n{server.log()}") from None
    finally:
        calls.cancel()
        await asyncio.gather(calls, return_exceptions=True)
    assert code == 0, server.log()
