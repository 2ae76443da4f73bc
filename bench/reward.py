"""Reward gateway throughput: math and structured-output workloads over gRPC and HTTP at
concurrency 1/16/64, against the same answers verified in one process in a loop.

Each workload mixes correct, equivalent-but-differently-written, wrong and malformed
(refused) answers. Every measurement uses fresh, distinct answers so that no verifier
cache (math-verify memoises parses) favours one side. The gateway runs as its own
process (`python -m rlfleet_reward`, default worker count = cores); the load generator
is this process. `grpc_group` sends the same kind of answers as ScoreGroup calls of 8
(the trainer's path: one RPC per prompt group). Target: math over gRPC (Score) at
concurrency 64 >= 1.5x the loop.

Side by side with NeMo-Gym 0.7.0 (rows `*_vs_nemo_gym`, baseline = NeMo-Gym's own
structured_outputs / math_with_judge server over HTTP, `_nemo_gym_peer.py`), the same
valid requests at concurrency 64, the peer measured just before ours: structured outputs
over HTTP (target >= 2x the peer's req/s, p99 <= 50 ms) and over gRPC ScoreGroup (>= 5x),
math over HTTP (>= 10x). Without $RLFLEET_NEMO_GYM_PYTHON / $RLFLEET_NEMO_GYM_SRC those
rows are skipped and the reason printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import grpc
from grpc import aio
from rlfleet_core.bench import BenchResult, percentile
from rlfleet_core.client import check_health
from rlfleet_core.ports import wait_for_port_file
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc
from rlfleet_reward.environments import get_environment
from rlfleet_reward.types import RowError, Sample


def _load_peer_module() -> Any:
    # `rlfleet bench` loads this file by path, not as a package: load the helper the same way.
    path = Path(__file__).with_name("_nemo_gym_peer.py")
    spec = importlib.util.spec_from_file_location("rlfleet_bench_nemo_gym_peer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


peer = _load_peer_module()

DESCRIPTION = "reward gateway rewards/s (math, structured outputs; gRPC Score/ScoreGroup, HTTP) vs a one-process verify loop"
CONCURRENCIES = (1, 16, 64)


class Item(NamedTuple):  # not a dataclass: `rlfleet bench` loads this file without sys.modules
    env: str
    row: dict[str, Any]
    text: str


def math_items(n: int, rng: random.Random) -> list[Item]:
    """Distinct math answers: 40% correct, 30% equivalent form, 20% wrong, 10% malformed row."""
    items = []
    for i in range(n):
        a, b = rng.randint(1, 999), rng.randint(2, 999)
        kind = i % 10
        if kind < 4:
            items.append(
                Item(
                    "math",
                    {"expected_answer": f"\\frac{{{a}}}{{{b}}}"},
                    f"So \\boxed{{\\frac{{{a}}}{{{b}}}}}",
                )
            )
        elif kind < 7:
            d = rng.choice([2, 4, 5, 8, 10])
            items.append(
                Item(
                    "math",
                    {"expected_answer": f"\\frac{{{a}}}{{{d}}}"},
                    f"The answer is \\boxed{{{a / d}}}",
                )
            )
        elif kind < 9:
            items.append(
                Item(
                    "math",
                    {"expected_answer": f"\\{{{a},{b}\\}}"},
                    f"\\boxed{{\\{{{a},{b + 1}\\}}}}",
                )
            )
        else:
            items.append(Item("math", {"question": f"{a}+{b}?"}, f"\\boxed{{{a + b}}}"))
    return items


def structured_items(n: int, rng: random.Random) -> list[Item]:
    schema = json.dumps(
        {
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["id", "tags"],
        }
    )
    items = []
    for i in range(n):
        k = rng.randint(0, 10**9)
        kind = i % 10
        if kind < 4:
            text = json.dumps({"id": k, "tags": ["a", str(k)]})
        elif kind < 7:
            text = "```json\n" + json.dumps({"tags": [str(k)], "id": k}, indent=2) + "\n```"
        elif kind < 9:
            text = json.dumps({"id": str(k), "tags": []}) if kind == 7 else f"{{'id': {k}}}"
        else:
            items.append(Item("structured_outputs", {"schema_str": "{not json"}, "{}"))
            continue
        items.append(Item("structured_outputs", {"schema_str": schema}, text))
    return items


WORKLOADS: dict[str, Callable[[int, random.Random], list[Item]]] = {
    "math": math_items,
    "structured": structured_items,
}


def loop_baseline(items: list[Item]) -> tuple[float, list[float]]:
    """The same answers verified one after another in this process (rewards/s, ms each)."""
    latencies = []
    start = time.perf_counter()
    for item in items:
        t0 = time.perf_counter()
        env = get_environment(item.env)
        with contextlib.suppress(RowError):
            env.score(env.parse_row(item.row), Sample(item.text))
        latencies.append((time.perf_counter() - t0) * 1e3)
    return len(items) / (time.perf_counter() - start), latencies


async def grpc_load(target: str, items: list[Item], concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = list(reversed(items))
    async with aio.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def worker() -> None:
            while queue:
                item = queue.pop()
                request = reward_pb2.ScoreRequest(
                    env=item.env,
                    row_json=json.dumps(item.row),
                    response=reward_pb2.Response(text=item.text),
                )
                t0 = time.perf_counter()
                try:
                    result = await stub.Score(request, timeout=60)
                    if result.failure_kind:
                        raise RuntimeError(f"unexpected failure: {result.failure_reason}")
                except aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                        raise
                latencies.append((time.perf_counter() - t0) * 1e3)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(items) / (time.perf_counter() - start), latencies


GROUP_SIZE = 8


async def grpc_group_load(
    target: str, items: list[Item], concurrency: int
) -> tuple[float, list[float]]:
    """ScoreGroup, as the trainer calls it: GROUP_SIZE responses per call, concurrency/GROUP_SIZE
    calls in flight (so `concurrency` responses in flight). Latency is per call."""
    latencies: list[float] = []
    groups = [items[i : i + GROUP_SIZE] for i in range(0, len(items), GROUP_SIZE)]
    async with aio.insecure_channel(target) as channel:
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def worker() -> None:
            while groups:
                group = groups.pop()
                # One prompt per group: the first item's row, every item's response.
                request = reward_pb2.ScoreGroupRequest(
                    env=group[0].env,
                    row_json=json.dumps(group[0].row),
                    responses=[reward_pb2.Response(text=i.text) for i in group],
                )
                t0 = time.perf_counter()
                try:
                    reply = await stub.ScoreGroup(request, timeout=60)
                    if any(r.failure_kind for r in reply.results):
                        raise RuntimeError("unexpected failure in a group")
                except aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                        raise
                latencies.append((time.perf_counter() - t0) * 1e3)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency // GROUP_SIZE))))
        return len(items) / (time.perf_counter() - start), latencies


async def http_load(
    url: str, items: list[Item], concurrency: int, peer_route: bool = False
) -> tuple[float, list[float]]:
    """POST each item as a NeMo-Gym verify request: to /{env}/verify here, or to /verify of
    a NeMo-Gym server (`peer_route`)."""
    latencies: list[float] = []
    queue = list(reversed(items))
    # aiohttp as the load generator (NeMo-Gym's clients use it; httpx's async pool is the
    # bottleneck past ~16 concurrent requests). It sets TCP_NODELAY itself.
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as client:

        async def worker() -> None:
            while queue:
                item = queue.pop()
                body = peer.verify_body(item.row, item.text)
                t0 = time.perf_counter()
                route = "/verify" if peer_route else f"/{item.env}/verify"
                async with client.post(route, json=body) as reply:
                    data = await reply.json()
                    ok = reply.status == 200 and "reward" in data and not data.get("failure_kind")
                    if not (ok or (reply.status == 422 and not peer_route)):
                        raise RuntimeError(f"unexpected reply {reply.status}: {str(data)[:200]}")
                latencies.append((time.perf_counter() - t0) * 1e3)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(items) / (time.perf_counter() - start), latencies


def start_gateway(log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    port_file = log.with_suffix(".ports.json")
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlfleet_reward",
            "--port",
            "0",
            "--http-port",
            "0",
            "--port-file",
            str(port_file),
            "environments=[math,structured_outputs]",
            "server.max_timeout_s=120",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        ports = wait_for_port_file(port_file, process, timeout_s=180)
    except RuntimeError as exc:
        process.kill()
        raise RuntimeError(f"gateway {exc}: {log.read_text()[-2000:]}") from None
    target, http_port = f"127.0.0.1:{ports.grpc}", ports.http
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            if check_health(target, timeout_s=1.0) == "SERVING":
                return process, target, f"http://127.0.0.1:{http_port}"
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("gateway did not start")


def _results(
    workload: str,
    protocol: str,
    concurrency: int,
    n: int,
    ours: tuple[float, list[float]],
    base: tuple[float, list[float]],
) -> list[BenchResult]:
    # The 1-minute load average: on a shared machine other processes' load moves the ratio
    # (two workers need two free cores to double the loop), so record it beside the number.
    extra = {
        "workload": workload,
        "protocol": protocol,
        "concurrency": concurrency,
        "answers": n,
        "workers": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    target = 1.5 if (workload, protocol, concurrency) == ("math", "grpc", 64) else None
    suffix = f"{workload}_{protocol}_c{concurrency}"
    return [
        BenchResult(
            "reward", f"rps_{suffix}", ours[0], "rewards/s", base[0], target=target, extra=extra
        ),
        BenchResult(
            "reward",
            f"p50_ms_{suffix}",
            percentile(ours[1], 50),
            "ms",
            percentile(base[1], 50),
            higher_is_better=False,
            extra=extra,
        ),
        BenchResult(
            "reward",
            f"p99_ms_{suffix}",
            percentile(ours[1], 99),
            "ms",
            percentile(base[1], 99),
            higher_is_better=False,
            extra=extra,
        ),
    ]


async def _measure(quick: bool, target: str, url: str) -> list[BenchResult]:
    rng = random.Random(1234)
    n = {"math": 96 if quick else 384, "structured": 400 if quick else 2000}
    results: list[BenchResult] = []
    for workload, make in WORKLOADS.items():
        # Warm both sides (imports, validators, connections) on answers not measured later.
        warm = make(32, rng)
        loop_baseline(warm)
        await grpc_load(target, warm, 8)
        await http_load(url, warm, 8)
        for concurrency in CONCURRENCIES:
            base_items, grpc_items, http_items = (make(n[workload], rng) for _ in range(3))
            base = loop_baseline(base_items)
            results += _results(
                workload,
                "grpc",
                concurrency,
                n[workload],
                await grpc_load(target, grpc_items, concurrency),
                base,
            )
            results += _results(
                workload,
                "http",
                concurrency,
                n[workload],
                await http_load(url, http_items, concurrency),
                base,
            )
            if concurrency >= GROUP_SIZE:
                results += _results(
                    workload,
                    "grpc_group",
                    concurrency,
                    n[workload],
                    await grpc_group_load(target, make(n[workload], rng), concurrency),
                    base,
                )
    return results


async def _versus(quick: bool, target: str, url: str, peers: dict[str, Any]) -> list[BenchResult]:
    """Ours vs NeMo-Gym's servers at concurrency 64, on the same valid requests; each
    peer run just before ours, so both see the same machine load."""
    rng = random.Random(4321)
    results: list[BenchResult] = []
    if "structured_outputs" in peers:
        them = peers["structured_outputs"].url
        items = peer.valid(structured_items(400 if quick else 2000, rng))
        await http_load(them, items[:64], 8, peer_route=True)  # warm both: connections,
        await http_load(url, items[:64], 8)  # the schema's compiled validator
        await grpc_group_load(target, items[:64], 64)
        theirs = await http_load(them, items, 64, peer_route=True)
        ours = await http_load(url, items, 64)
        results += peer.versus_rows("structured_http_c64", ours, theirs, 2.0, len(items))
        theirs = await http_load(them, items, 64, peer_route=True)
        ours = await grpc_group_load(target, items, 64)
        results += peer.versus_rows("structured_grpc_group_c64", ours, theirs, 5.0, len(items))
    if "math" in peers:
        them = peers["math"].url
        items = peer.valid(math_items(72 if quick else 288, rng))
        warm = peer.valid(math_items(16, rng))
        await http_load(them, warm, 8, peer_route=True)
        await http_load(url, warm, 8)
        theirs = await http_load(them, items, 64, peer_route=True)
        ours = await http_load(url, items, 64)
        results += peer.versus_rows("math_http_c64", ours, theirs, 10.0, len(items))
    return results


def run(quick: bool = False) -> list[BenchResult]:
    with tempfile.TemporaryDirectory() as folder:
        peers = peer.start_all(Path(folder))
        process, target, url = start_gateway(Path(folder) / "gateway.log")
        try:
            results = asyncio.run(_versus(quick, target, url, peers))
            if os.environ.get("RLFLEET_BENCH_REWARD_VERSUS_ONLY") != "1":
                results += asyncio.run(_measure(quick, target, url))
            return results
        finally:
            for running in peers.values():
                running.stop()
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
