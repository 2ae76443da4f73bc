"""Time of a SWE `Evaluate` through the swe-runner service (gRPC on loopback, docker, the
in-container driver: the applied-tree check, the HMAC'd outcome stream from a plugin loaded
under a random name, PID-1 reaping of leftovers) against a bare run of the same work: the
same `docker run` line (the runner's own, so the same limits, network and capabilities)
that applies the same two patches with `git apply` and runs the same test command, judged
by its exit status only (the shape of SWE-bench's harness: no checks, no stream). Gold
patches of the bundled tiny instances, at concurrency 1 and 4 (eval.max_concurrent's
default), the two interleaved so that drift of the machine hits both.

What the evidence costs is the ratio (lower seconds are better; ratio = bare / ours).
RLFLEET_SWE_BENCH_BEFORE names the rows of an earlier tree (`rlfleet bench swe-evaluate
--json --no-save` with that tree's swe-runner first on PYTHONPATH), kept as before_*.
Needs Docker; builds the instance images (cached by content) and the base image if missing.
Target: ratio >= 0.8 at concurrency 1 (the checks cost at most a quarter of a bare run)."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from grpc import aio
from rlfleet_core.bench import BenchResult, attach_before, before_rows, percentile
from rlfleet_core.server import ServerConfig, start_service
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.backends import Limits, RunnerIdentity, make_backend
from rlfleet_swe.config import SweRunnerServiceConfig
from rlfleet_swe.images import build_images, bundled_instances_dir
from rlfleet_swe.instances import SweInstance, load_instances
from rlfleet_swe.service import SERVICE

DESCRIPTION = "SWE Evaluate (service + checked driver) vs a bare docker run of the same tests"
BEFORE_ENV = "RLFLEET_SWE_BENCH_BEFORE"
REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300.0

# The bare harness: both patches applied, the test command run, its exit status returned.
BARE = """
import json, subprocess, sys
req = json.load(sys.stdin)
for name in ("patch", "test_patch"):
    path = "/tmp/" + name + ".diff"
    with open(path, "w") as fh:
        fh.write(req[name])
    subprocess.run(["git", "apply", path], check=True)
sys.exit(subprocess.run(req["test_command"], shell=True, stdin=subprocess.DEVNULL).returncode)
"""


def _images() -> list[SweInstance]:
    # The build's own lines go to stderr: stdout carries the result rows (`--json`).
    subprocess.run(
        [str(REPO / "deploy/docker/build-base.sh")], check=True, timeout=1800, stdout=sys.stderr
    )
    build_images()
    return load_instances(bundled_instances_dir() / "instances.jsonl")


async def _bare(config: SweRunnerServiceConfig, instance: SweInstance) -> float:
    ev = config.eval
    backend = make_backend(ev, RunnerIdentity(ev.runner_label))
    name = f"rlfleet-swe-bench-{secrets.token_hex(4)}"
    argv = backend.command(name, instance.image, instance.workdir,
                           Limits(ev.memory_bytes, ev.cpus, ev.pids_limit), ["python3", "-c", BARE])  # fmt: skip
    payload = json.dumps({"patch": instance.patch, "test_patch": instance.test_patch,
                          "test_command": instance.test_command}).encode()  # fmt: skip
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(payload), TIMEOUT_S)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        tail = out.decode(errors="replace")[-1500:]
        raise RuntimeError(f"bare run of {instance.instance_id} exited {proc.returncode}:\n{tail}")
    return seconds


async def _ours(stub: swe_pb2_grpc.SweRunnerServiceStub, instance: SweInstance) -> float:
    request = swe_pb2.EvaluateRequest(
        instance_id=instance.instance_id, image=instance.image, workdir=instance.workdir,
        patch=instance.patch, test_patch=instance.test_patch, test_command=instance.test_command,
        fail_to_pass=instance.fail_to_pass, pass_to_pass=instance.pass_to_pass,
        timeout_s=TIMEOUT_S,
    )  # fmt: skip
    started = time.perf_counter()
    result = await stub.Evaluate(request, timeout=TIMEOUT_S + 60)
    seconds = time.perf_counter() - started
    if result.status != swe_pb2.EVAL_STATUS_COMPLETED or not result.resolved:
        raise RuntimeError(
            f"gold patch of {instance.instance_id} not resolved: "
            f"{swe_pb2.EvalStatus.Name(result.status)} {result.error}\n{result.log_tail[-1500:]}"
        )
    return seconds


async def _batch(
    run: Callable[[SweInstance], Awaitable[float]], jobs: list[SweInstance], concurrency: int
) -> tuple[float, list[float]]:
    """(wall seconds, per-job seconds) of `jobs` run `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(instance: SweInstance) -> float:
        async with gate:
            return await run(instance)

    started = time.perf_counter()
    seconds = await asyncio.gather(*(one(i) for i in jobs))
    return time.perf_counter() - started, list(seconds)


async def _measure(quick: bool) -> list[BenchResult]:
    instances = await asyncio.to_thread(_images)
    label = f"swe-bench-{secrets.token_hex(4)}"
    config = SweRunnerServiceConfig.model_validate(
        {"server": ServerConfig(port=0), "eval": {"runner_label": label}}
    )
    running = await start_service(SERVICE, config)
    results: list[BenchResult] = []
    try:
        async with aio.insecure_channel(f"127.0.0.1:{running.grpc_port}") as channel:
            stub = swe_pb2_grpc.SweRunnerServiceStub(channel)
            await _ours(stub, instances[0])  # warm: page cache, the runner's first call
            await _bare(config, instances[0])
            for concurrency in (1, 4):
                rounds = 1 if quick else (3 if concurrency == 1 else 2)
                jobs = [i for _ in range(rounds) for i in instances]
                ours_wall, bare_wall = 0.0, 0.0
                ours_each: list[float] = []
                bare_each: list[float] = []
                for k in range(rounds):  # interleaved: each round runs both, in turn
                    chunk = jobs[k * len(instances) : (k + 1) * len(instances)]
                    wall, each = await _batch(lambda i: _bare(config, i), chunk, concurrency)
                    bare_wall, bare_each = bare_wall + wall, bare_each + each
                    wall, each = await _batch(lambda i: _ours(stub, i), chunk, concurrency)
                    ours_wall, ours_each = ours_wall + wall, ours_each + each
                extra = {"concurrency": concurrency, "evaluations": len(jobs),
                         "instances": [i.instance_id for i in instances]}  # fmt: skip
                tag = f"c{concurrency}"
                results += [
                    BenchResult("swe-evaluate", f"mean_s_{tag}", sum(ours_each) / len(ours_each),
                                "s", sum(bare_each) / len(bare_each), higher_is_better=False,
                                target=0.8 if concurrency == 1 else None, extra=extra),
                    BenchResult("swe-evaluate", f"p90_s_{tag}", percentile(ours_each, 90), "s",
                                percentile(bare_each, 90), higher_is_better=False, extra=extra),
                    BenchResult("swe-evaluate", f"per_min_{tag}", 60 * len(jobs) / ours_wall,
                                "evaluations/min", 60 * len(jobs) / bare_wall, extra=extra),
                ]  # fmt: skip
    finally:
        running.stop_event.set()
        await running.done
    attach_before(results, before_rows(BEFORE_ENV))
    return results


def run(quick: bool = False) -> list[BenchResult]:
    return asyncio.run(_measure(quick))
