"""Reward gateway under a hostile mix (issue 12): /healthz p99 while 1,000 concurrent
requests over gRPC and HTTP (10% malformed, 1% of 1-5 MB or pathological) hit a gateway
with two workers; the baseline is /healthz p99 of the same gateway idle, measured just
before. The probe runs in a process of its own. Also reported: the share of requests
answered within their deadline with the expected kind of answer (a verdict, or a 4xx /
INVALID_ARGUMENT for the malformed ones), and 5xx answers. Target: p99 < 100 ms, all
answered, no 5xx. The mix and its pass rules are services/reward/tests/load_mix.py,
which test_load_mix.py also runs.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from rlfleet_core.bench import BenchResult

TESTS = Path(__file__).resolve().parents[1] / "services" / "reward" / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from load_mix import idle_health, percentile, run_mix  # noqa: E402
from reward_support import start_reward_server, stop_reward_server  # noqa: E402

DESCRIPTION = (
    "reward gateway /healthz p99 under 1,000 concurrent hostile requests (10% malformed, 1% 1-5 MB)"
)
LIMIT_MS = 100.0


def run(quick: bool = False) -> list[BenchResult]:
    n = 500 if quick else 1000
    with tempfile.TemporaryDirectory() as tmp:
        server = start_reward_server(Path(tmp), ["pool.workers=2"], name="reward-load")
        try:
            idle = idle_health(server.http_url, 3.0)
            mix = asyncio.run(run_mix(server.grpc_target, server.http_url, n=n))
        finally:
            stop_reward_server(server)
    extra = {
        "requests": n,
        "workers": 2,
        "cores": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "probes": len(mix.health_s),
        "outcomes": dict(mix.outcomes),
        "slowest_request_s": round(mix.slowest_s, 2),
        "wall_s": round(mix.wall_s, 2),
        "limit_ms": LIMIT_MS,
    }
    p99, p50 = 1000 * percentile(mix.health_s, 0.99), 1000 * percentile(mix.health_s, 0.5)
    fivexx = sum(v for k, v in mix.outcomes.items() if k.startswith("http:5"))
    in_time = 1 - len(mix.violations) / n
    return [
        BenchResult(
            "reward-load",
            "healthz_p99_ms",
            p99,
            "ms",
            1000 * percentile(idle, 0.99),
            higher_is_better=False,
            extra={**extra, "under_limit": p99 < LIMIT_MS},
        ),
        BenchResult(
            "reward-load",
            "healthz_p50_ms",
            p50,
            "ms",
            1000 * percentile(idle, 0.5),
            higher_is_better=False,
            extra=extra,
        ),
        BenchResult(
            "reward-load",
            "answered_in_deadline",
            in_time,
            "fraction",
            1.0,
            target=1.0,
            extra={**extra, "violations": mix.violations[:20], "http_5xx": fivexx},
        ),
    ]
