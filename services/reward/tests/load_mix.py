"""A hostile load mix for the reward gateway, shared by test_load_mix.py and
bench/reward_load.py: `n` requests at once over gRPC and HTTP, 10% malformed and 1%
of 1-5 MB or pathological, while /healthz is probed every 20 ms.

Each request has a deadline (gRPC: the call's timeout; HTTP: the client's timeout). A
request "passes" when it is answered before its deadline with an expected kind of answer
(a verdict, including an explicit TIMEOUT failure; or 4xx/INVALID_ARGUMENT for the
malformed and oversized ones) and never with a 5xx or another gRPC error.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
from grpc import aio
from rlfleet_proto.v1 import reward_pb2, reward_pb2_grpc

MB = 1 << 20
DEADLINE_S = 30.0  # every request's deadline; the gateway's own budget is timeout_s (10 s)


@dataclass
class MixResult:
    outcomes: Counter[str] = field(default_factory=Counter)
    """Answer kinds: grpc:OK, grpc:INVALID_ARGUMENT, http:200, http:422, http:413 ..."""
    violations: list[str] = field(default_factory=list)
    """Requests answered late, with a 5xx, an unexpected status, or not at all."""
    health_s: list[float] = field(default_factory=list)
    """Latency of each /healthz probe during the load (inf = no answer within 5 s)."""
    slowest_s: float = 0.0
    wall_s: float = 0.0


def _response(text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"output": [{"type": "message", "role": "assistant", "content": content}]}


def _body(row: dict[str, Any], text: str) -> bytes:
    return json.dumps({**row, "response": _response(text)}).encode()


_SCHEMA = json.dumps({"type": "object", "required": ["id"]})
_REDOS = json.dumps({"type": "string", "pattern": "^(a+)+$"})

# (kind, route or env, payload, expected answers); kind "http": payload is the body bytes;
# "grpc": a ScoreRequest; "group": a ScoreGroupRequest.
Request = tuple[str, str, Any, frozenset[str]]
_SCORED = frozenset({"http:200"})
_OK = frozenset({"grpc:OK"})


def _http(route: str, body: bytes, *expected: str) -> Request:
    return ("http", route, body, frozenset(expected) if expected else _SCORED)


def _grpc(env: str, row: dict[str, Any] | str, text: str, *expected: str) -> Request:
    row_json = row if isinstance(row, str) else json.dumps(row)
    request = reward_pb2.ScoreRequest(
        env=env, row_json=row_json, response=reward_pb2.Response(text=text)
    )
    return ("grpc", env, request, frozenset(expected) if expected else _OK)


def _large_or_pathological(k: int) -> Request:
    """The 1%: 1-5 MB payloads and inputs that are slow or hostile to parse."""
    math_row = {"expected_answer": "4"}
    cases: list[Callable[[], Request]] = [
        lambda: _http("math", _body(math_row, "1 " * 500_000)),  # 1 MB answer, scored
        lambda: _http("math", _body({**math_row, "x": "a" * (5 * MB)}, "4"), "http:413"),
        lambda: _grpc("math", math_row, "7" * (3 * MB), "grpc:INVALID_ARGUMENT"),
        lambda: _http("math", b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "http:422"),
        lambda: _grpc("math", math_row, r"\boxed{9^{9^{9^{9}}}}"),  # a power tower
        lambda: _http("structured_outputs", _body({"schema_str": _REDOS}, '"' + "a" * 40 + '!"')),
        lambda: _http(
            "instruction_following",
            _body({"instruction_id_list": ["punctuation:no_comma"] * 40_000}, "hi"),
            "http:413",
        ),
        lambda: (
            "group",
            "math",
            reward_pb2.ScoreGroupRequest(
                env="math",
                row_json=json.dumps(math_row),
                responses=[reward_pb2.Response(text="2 " * 450_000)] * 4,  # 3.6 MB
            ),
            _OK,
        ),
        lambda: _http(
            "math",
            _body(math_row, "4").replace(b"{", b'{"n": ' + b"9" * 5000 + b", ", 1),
            "http:422",
        ),
        lambda: _http("math", _body(math_row, " " * MB)),  # a 1 MB run of whitespace
    ]
    return cases[k % len(cases)]()


def _malformed(k: int) -> Request:
    """The 10%: bodies and rows that must be refused, naming a field."""
    cases: list[Callable[[], Request]] = [
        lambda: _http(
            "math", _body({"expected_answer": "4"}, "4")[:-1] + b', "x": NaN}', "http:422"
        ),
        lambda: _http("math", _body({"expected_answer": "4", "x": "\ud800"}, "4"), "http:422"),
        lambda: _http("math", _body({}, "4"), "http:422"),
        lambda: _http("math", b"{broken", "http:422"),
        lambda: _http("nope", _body({}, "4"), "http:422"),
        lambda: _grpc("math", "{broken", "4", "grpc:INVALID_ARGUMENT"),
        lambda: _grpc("math", '{"expected_answer": "4", "x": NaN}', "4", "grpc:INVALID_ARGUMENT"),
        lambda: _grpc("nope", {}, "4", "grpc:INVALID_ARGUMENT"),
        lambda: _grpc("structured_outputs", {"schema_str": "{x"}, "{}", "grpc:INVALID_ARGUMENT"),
        lambda: _http("mcqa", _body({"expected_answer": 7}, "A"), "http:422"),
    ]
    return cases[k % len(cases)]()


def _valid(i: int) -> Request:
    kind = i % 6
    if kind == 0:
        return _grpc(
            "mcqa", {"expected_answer": "B", "grading_mode": "lenient"}, f"Answer: {'ABCD'[i % 4]}"
        )
    if kind == 1:
        return _http(
            "mcqa",
            _body({"expected_answer": "C", "grading_mode": "lenient"}, f"Answer: {'ABCD'[i % 4]}"),
        )
    if kind == 2:
        return _grpc("structured_outputs", {"schema_str": _SCHEMA}, json.dumps({"id": i}))
    if kind == 3:
        return _http("structured_outputs", _body({"schema_str": _SCHEMA}, json.dumps({"id": i})))
    if kind == 4:
        return _grpc("math", {"expected_answer": f"{i % 97}"}, rf"\boxed{{{i % 97}}}")
    return _http("math", _body({"expected_answer": f"{i % 89}"}, rf"\boxed{{{i % 88}}}"))


def build_mix(n: int) -> list[Request]:
    """`n` requests: every 100th large or pathological, every 10th (offset 5) malformed."""
    return [
        _large_or_pathological(i // 100)
        if i % 100 == 0
        else _malformed(i // 10)
        if i % 10 == 5
        else _valid(i)
        for i in range(n)
    ]


def _probe(url: str, ready: Any, stop: Any, out: Any) -> None:
    """Probe /healthz every 20 ms until `stop` is set; send the latencies through `out`.
    Runs in a process of its own, so the load generator's busy event loop does not
    inflate what it measures."""
    latencies = []
    with httpx.Client(timeout=5.0) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                ok = client.get(f"{url}/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - start if ok else float("inf"))
            ready.set()
            time.sleep(0.02)
    out.send(latencies)


async def run_mix(grpc_target: str, http_url: str, n: int = 1000) -> MixResult:
    result = MixResult()
    requests = build_mix(n)
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    probe = ctx.Process(target=_probe, args=(http_url, ready, stop, send), daemon=True)
    probe.start()
    await asyncio.to_thread(ready.wait, 60.0)  # probing before the load starts
    connector = aiohttp.TCPConnector(limit=200)
    timeout = aiohttp.ClientTimeout(total=DEADLINE_S)
    async with (
        aio.insecure_channel(
            grpc_target, options=[("grpc.max_send_message_length", 64 * MB)]
        ) as channel,
        aiohttp.ClientSession(http_url, connector=connector, timeout=timeout) as session,
    ):
        stub = reward_pb2_grpc.RewardServiceStub(channel)

        async def one(i: int, request: Request) -> None:
            kind, where, payload, expected = request
            start = time.perf_counter()
            call: Awaitable[Any]
            try:
                if kind == "http":
                    async with session.post(
                        f"/{where}/verify",
                        data=payload,
                        headers={"content-type": "application/json"},
                    ) as reply:
                        await reply.read()
                        answer = f"http:{reply.status}"
                else:
                    call = (stub.Score if kind == "grpc" else stub.ScoreGroup)(
                        payload, timeout=DEADLINE_S
                    )
                    await call
                    answer = "grpc:OK"
            except aio.AioRpcError as exc:
                answer = f"grpc:{exc.code().name}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                answer = f"http:{type(exc).__name__}"
            elapsed = time.perf_counter() - start
            result.slowest_s = max(result.slowest_s, elapsed)
            result.outcomes[answer] += 1
            if answer not in expected or elapsed > DEADLINE_S:
                result.violations.append(f"#{i} {kind} {where}: {answer} in {elapsed:.2f}s")

        start = time.perf_counter()
        await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        result.wall_s = time.perf_counter() - start
    stop.set()
    if await asyncio.to_thread(receive.poll, 30.0):
        result.health_s = receive.recv()
    probe.join(5.0)
    return result


def idle_health(http_url: str, seconds: float) -> list[float]:
    """/healthz latencies with no load, probed the same way (a benchmark's baseline)."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    probe = ctx.Process(target=_probe, args=(http_url, ready, stop, send), daemon=True)
    probe.start()
    ready.wait(60.0)
    time.sleep(seconds)
    stop.set()
    latencies: list[float] = receive.recv() if receive.poll(30.0) else []
    probe.join(5.0)
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")
