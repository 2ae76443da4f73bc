"""Runners and session commands that must not hurt each other, through the real service
and docker: two runners on one engine keep each other's containers (only a gone runner's
leftovers are removed at start), a command leaves nothing running behind it (background
jobs, setsid, a fork bomb), submit leaves build junk out of the patch, and the disk cap
(per-file ulimit and the writable-layer watchdog) ends a command, or scores 0 a patch,
that writes too much."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc import aio
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.backends import INSTANCE_LABEL, OWNER_LABEL, RUNNER_LABEL, process_owner
from rlfleet_swe.images import Built
from rlfleet_swe.service import SERVICE
from swe_testlib import diff_of, host_checkout, labelled, request_for, runner_overrides
from test_sessions import INSTANCE, KEY, SESSIONS, open_session, tool

DISK = ["eval.disk_bytes=16777216", "eval.disk_check_interval_s=0.5"]


@pytest.fixture
def service_overrides() -> list[str]:
    """conftest's `stub` service with test_sessions' session limits and a small disk cap."""
    return [*SESSIONS, *DISK]


async def bash(
    stub: swe_pb2_grpc.SweRunnerServiceStub, session: str, command: str, timeout_s: float = 0
) -> swe_pb2.SweRunToolReply:
    return await tool(stub, session, tool=swe_pb2.SWE_TOOL_BASH, command=command,
                      timeout_s=timeout_s)  # fmt: skip


async def close(stub: swe_pb2_grpc.SweRunnerServiceStub, session: str) -> None:
    await stub.CloseSweSession(swe_pb2.SweCloseSessionRequest(session_id=session), metadata=KEY)


async def test_a_second_runner_keeps_the_first_ones_sessions(
    stub: swe_pb2_grpc.SweRunnerServiceStub, runner_label: str
) -> None:
    """Same runner label (as every runner of a deployment has): starting the second used
    to remove the first's session container."""
    session = await open_session(stub)
    async with running_service(SERVICE, runner_overrides(runner_label)):
        assert len(labelled(runner_label)) == 1
        after = await bash(stub, session, "echo still here")
        assert after.output.strip() == "still here" and after.exit_code == 0
    after = await bash(stub, session, "echo still here")  # the second one's stop spares it too
    assert after.output.strip() == "still here"
    await close(stub, session)


def _leftover(labels: dict[str, str]) -> str:
    args = [a for key, value in labels.items() for a in ("--label", f"{key}={value}")]
    done = subprocess.run(
        ["docker", "run", "-d", "--rm", *args, "--network", "none", INSTANCE.image, "sleep", "600"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip()[:12]


async def test_only_a_gone_runners_leftovers_are_removed_at_start(
    images: list[Built], runner_label: str
) -> None:
    host, boot, pid, _ = process_owner().split("/")
    group = {RUNNER_LABEL: runner_label, INSTANCE_LABEL: "0123abcd"}
    crashed = _leftover({**group, OWNER_LABEL: f"{host}/{boot}/{pid}/1"})  # pid reused since
    alive = _leftover({**group, OWNER_LABEL: process_owner()})
    elsewhere = _leftover({**group, OWNER_LABEL: f"other-host/{boot}/1/1"})
    try:
        async with running_service(SERVICE, runner_overrides(runner_label)):
            left = {c[:12] for c in labelled(runner_label)}
            assert crashed not in left and {alive, elsewhere} <= left
    finally:
        subprocess.run(["docker", "rm", "-f", alive, elsewhere], capture_output=True, timeout=60)


async def test_nothing_a_command_started_outlives_it(
    stub: swe_pb2_grpc.SweRunnerServiceStub,
) -> None:
    session = await open_session(stub)
    started = await bash(stub, session, "sleep 1000 & setsid sleep 1001 >/dev/null 2>&1 & echo bg")
    assert started.output.strip() == "bg" and not started.timed_out
    procs = await bash(stub, session, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "sleep 1000" not in procs.output and "sleep 1001" not in procs.output, procs.output
    assert "signal.pause()" in procs.output  # the session's PID 1 (it reaps) is left
    await close(stub, session)


async def test_a_fork_bomb_ends_with_its_command(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    session = await open_session(stub)
    await bash(stub, session, ":(){ :|:& };:", timeout_s=5)
    after = await bash(stub, session, "echo ok; ls /proc | grep -c '^[0-9]'", timeout_s=20)
    assert after.exit_code == 0 and not after.timed_out, after.output
    lines = after.output.split()
    assert lines[0] == "ok" and int(lines[1]) <= 6, after.output  # PID 1, bash, grep, ls...
    await close(stub, session)


async def test_submit_leaves_build_junk_out(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    session = await open_session(stub)
    ran = await bash(stub, session, "python3 -m pytest -q -p no:randomly >/dev/null; "
                     "find . -name '*.pyc' | head -1; ls -d .pytest_cache")  # fmt: skip
    assert ".pyc" in ran.output and ".pytest_cache" in ran.output, ran.output
    await bash(stub, session, "echo '# touched' >> tinystats/core.py")
    submitted = await tool(stub, session, tool=swe_pb2.SWE_TOOL_SUBMIT)
    assert not submitted.error, submitted.output
    assert "diff --git a/tinystats/core.py" in submitted.patch
    for junk in ("__pycache__", ".pyc", ".pytest_cache"):
        assert junk not in submitted.patch
    await close(stub, session)


async def test_the_disk_cap_ends_a_command_and_the_runner_survives(
    stub: swe_pb2_grpc.SweRunnerServiceStub,
) -> None:
    session = await open_session(stub)
    # One file past the cap: the kernel refuses the write (ulimit fsize); the session lives.
    big = await bash(stub, session, "head -c 33554432 /dev/zero > big; echo rc=$?; ls -l big")
    assert "File size limit exceeded" in big.output and "rc=153" in big.output, big.output
    assert (await bash(stub, session, "rm big; echo ok")).output.strip() == "ok"
    # Many files, each under the cap: the watchdog removes the container.
    many = await bash(
        stub, session, "for i in 1 2 3 4 5 6; do head -c 8000000 /dev/zero > f$i; done; sleep 60"
    )
    assert many.error and "over eval.disk_bytes=16777216" in many.output, many.output
    assert "session closed" in many.output
    with pytest.raises(aio.AioRpcError) as info:
        await bash(stub, session, "true")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    other = await open_session(stub)  # the runner still serves
    assert (await bash(stub, other, "echo fine")).output.strip() == "fine"
    await close(stub, other)


async def test_a_patch_that_fills_the_disk_scores_zero(
    stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    """The patched module writes 48 MB at import in 6 MB files (each under the cap)."""
    fill = (
        "for _i in range(8):\n"
        "    open('/tmp/fill%d' % _i, 'wb').write(b'0' * 6000000)\n"
        "import time\ntime.sleep(60)\n"
    )
    repo = host_checkout(INSTANCE, tmp_path / "repo")
    text = (repo / "tinystats/core.py").read_text()
    patch = diff_of(repo, {"tinystats/core.py": (text, fill + text)})
    result = await stub.Evaluate(request_for(INSTANCE, patch), timeout=180)
    assert result.status == swe_pb2.EVAL_STATUS_COMPLETED and not result.resolved
    assert "over eval.disk_bytes=16777216" in result.error, (result.error, result.log_tail)
    assert all(t.outcome == swe_pb2.TEST_OUTCOME_MISSING for t in result.tests)
    assert (await stub.Evaluate(request_for(INSTANCE, INSTANCE.patch), timeout=180)).resolved


async def test_an_old_leftover_of_a_runner_elsewhere_is_removed_at_start(
    images: list[Built], runner_label: str
) -> None:
    """Issue 28: a crashed runner on another host (or in another container) left containers
    that no runner ever removed. Past eval.foreign_reap_after_s (here 1 s, the container
    made 2 s before) they are removed; a checkable live owner's container stays."""
    boot = process_owner().split("/")[1]
    group = {RUNNER_LABEL: runner_label, INSTANCE_LABEL: "0123abcd"}
    elsewhere = _leftover({**group, OWNER_LABEL: f"other-host/{boot}/1/1"})
    alive = _leftover({**group, OWNER_LABEL: process_owner()})
    await asyncio.sleep(2.0)  # older than the 1 s cap below, whatever the load
    overrides = runner_overrides(runner_label, "eval.foreign_reap_after_s=1")
    try:
        async with running_service(SERVICE, overrides):
            left = {c[:12] for c in labelled(runner_label)}
            assert elsewhere not in left and alive in left
    finally:
        subprocess.run(["docker", "rm", "-f", alive, elsewhere], capture_output=True, timeout=60)


def test_a_crashed_runner_leaves_no_client_process(tmp_path: Path) -> None:
    """Issue 28: the `docker run` client runs in its own session (so the watchdog can kill
    its group) and outlived a runner killed with SIGKILL. Now it gets PR_SET_PDEATHSIG."""
    program = (
        "import asyncio, sys\n"
        "from rlfleet_swe.backends import run_cmd\n"
        "asyncio.run(run_cmd(['sh', '-c', 'echo $$ > ' + sys.argv[1] + '.tmp; mv '"
        " + sys.argv[1] + '.tmp ' + sys.argv[1] + '; exec sleep 600'], 600))\n"
    )
    pid_file = tmp_path / "client.pid"
    runner = subprocess.Popen([sys.executable, "-c", program, str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
        deadline = time.monotonic() + 30  # a wait, not a timing assertion
        while time.monotonic() < deadline and _running(child):
            time.sleep(0.05)
        assert not _running(child), "the client outlived its runner"
    finally:
        runner.kill()
        runner.wait()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
