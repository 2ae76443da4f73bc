"""Cost of rlfleet's server bootstrap (interceptors: request ids, deadlines, error
mapping, logging, metrics) on a trivial unary RPC, against a bare grpc.aio server with
the same handler, in the same run. Target: >= 0.8x the bare server's throughput."""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc import aio
from rlfleet_core.bench import BenchResult, percentile
from rlfleet_core.server import (
    BaseService,
    ServerConfig,
    ServiceConfig,
    ServiceDefinition,
    start_service,
)

DESCRIPTION = "unary RPC throughput through the rlfleet server bootstrap vs a bare grpc.aio server"
METHOD = "/rlfleet.bench.Echo/Echo"
ROUNDS = 3


async def _echo(request: bytes, context: aio.ServicerContext) -> bytes:
    return request


def _handler() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "rlfleet.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )


class _EchoService(BaseService):
    def __init__(self, config: ServiceConfig) -> None:
        pass

    def add_to_server(self, server: aio.Server) -> None:
        server.add_generic_rpc_handlers((_handler(),))


_DEFINITION = ServiceDefinition(
    name="bench-echo",
    package="rlfleet-core",
    grpc_services=("rlfleet.bench.Echo",),
    config_model=ServiceConfig,
    factory=_EchoService,
)


async def _load(port: int, concurrency: int, total: int) -> tuple[float, list[float]]:
    """`total` calls from `concurrency` workers; returns (calls/s, latencies in ms)."""
    latencies: list[float] = []
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = channel.unary_unary(METHOD)
        await stub(b"warm", timeout=10)
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                await stub(b"x" * 64, timeout=10)
                latencies.append((time.perf_counter() - t0) * 1e3)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start), latencies


async def _measure(quick: bool) -> list[BenchResult]:
    total = 600 if quick else 6000
    results = []
    for concurrency in (1, 16):
        bare = aio.server()
        bare.add_generic_rpc_handlers((_handler(),))
        bare_port = bare.add_insecure_port("127.0.0.1:0")
        await bare.start()
        ours = await start_service(_DEFINITION, ServiceConfig(server=ServerConfig(port=0)))
        try:
            # Interleave rounds so machine noise (a shared 2-core box) hits both alike;
            # report each side's median round.
            base_rounds, our_rounds = [], []
            for _ in range(ROUNDS):
                base_rounds.append(await _load(bare_port, concurrency, total // ROUNDS))
                our_rounds.append(await _load(ours.grpc_port, concurrency, total // ROUNDS))
            base_rps, base_lat = sorted(base_rounds)[ROUNDS // 2]
            our_rps, our_lat = sorted(our_rounds)[ROUNDS // 2]
        finally:
            await bare.stop(0)
            ours.stop_event.set()
            await ours.done
        extra = {"concurrency": concurrency, "calls": total}
        results.append(
            BenchResult(
                "grpc-overhead",
                f"rps_c{concurrency}",
                our_rps,
                "calls/s",
                base_rps,
                target=0.8,
                extra=extra,
            )
        )
        results.append(
            BenchResult(
                "grpc-overhead",
                f"p50_ms_c{concurrency}",
                percentile(our_lat, 50),
                "ms",
                percentile(base_lat, 50),
                higher_is_better=False,
                extra=extra,
            )
        )
    return results


def run(quick: bool = False) -> list[BenchResult]:
    return asyncio.run(_measure(quick))
