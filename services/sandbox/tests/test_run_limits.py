"""Limits bound a whole run, not each process of it (issue 28 item 3): forked children
together over the memory or the CPU limit end the run as MEMORY or TIMEOUT, while a
program whose children stay under the limits together still runs OK. Real bubblewrap,
real service on loopback (the `sandbox` fixture of conftest.py).

Before the fix every process had its own RLIMIT_AS / RLIMIT_CPU: N children could hold N x
memory_bytes and N x cpu_time_s, and the run was reported OK."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rlfleet_proto.v1 import sandbox_pb2
from rlfleet_sandbox.config import LimitsConfig
from rlfleet_sandbox.engine import to_result
from rlfleet_sandbox.isolation import (
    SandboxCgroup,
    cgroup_v2_mount,
    own_cgroup_v2_path,
    setup_cgroup_v2,
)
from rlfleet_sandbox.sandbox import RawRun
from rlfleet_sandbox.types import RunLimits, Status, resolve_limits
from sandbox_testlib import Harness

MiB = 1 << 20

# Each child touches `each` MiB (b"\1" * n writes every page; bytearray(n) would not),
# says so, then holds it for a while; the parent waits for all of them.
_HOLDERS = """
import ctypes, os, sys, time
each, children, hide = {each}, {children}, {hide}
print("ATTEMPT", flush=True)
pids = []
for i in range(children):
    pid = os.fork()
    if pid == 0:
        if hide and i == 0:
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no smaps for others
        block = b"\\1" * (each << 20)
        print("HELD", i, flush=True)
        time.sleep({hold_s})
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print("ALL DONE", flush=True)
"""


async def test_forked_children_together_over_the_memory_limit_are_memory(
    sandbox: Harness,
) -> None:
    # 4 x 80 MiB = 320 MiB against a 192 MiB run; each child alone is well under its
    # RLIMIT_AS. One child hides its smaps (non-dumpable): it still counts, by its RSS.
    code = _HOLDERS.format(each=80, children=4, hide=True, hold_s=10)
    result = await sandbox.run(code, memory_bytes=192 * MiB, timeout_s=20)
    assert "ATTEMPT" in result.stdout, result
    assert result.status == sandbox_pb2.EXEC_STATUS_MEMORY, result
    assert "ALL DONE" not in result.stdout
    await sandbox.assert_healthy()


# 3 children each spin 0.8 s of CPU (under the per-process 1 s RLIMIT_CPU), then exit at
# once: the reaped children's CPU counts too; 2.4 s against a 1 s limit.
_CPU_CHILDREN = """
import os, time
print("ATTEMPT", flush=True)
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        while time.process_time() < 0.8:
            pass
        os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
print("ALL DONE", flush=True)
"""

# Orphaned grandchildren (reparented to the runner) that each spin 0.2 s of CPU and exit:
# 10 x 0.2 s, one after the other, against a 1 s limit. The program waits for each
# grandchild's 0.2 s (a byte on a pipe) before the next, so the 2 s are spent before it
# can end, however loaded the machine: with a sleep between them instead, a loaded run
# ended before its grandchildren had spent their CPU (0.64 s counted).
_CPU_GRANDCHILDREN = """
import os, time
print("ATTEMPT", flush=True)
for _ in range(10):
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            while time.process_time() < 0.2:
                pass
            os.write(done_w, b"x")
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(done_w)
    os.read(done_r, 1)
    os.close(done_r)
print("ALL DONE", flush=True)
"""


@pytest.mark.parametrize(
    "code",
    [
        pytest.param(_CPU_CHILDREN, id="children_together"),
        pytest.param(_CPU_GRANDCHILDREN, id="many_short_lived_grandchildren"),
    ],
)
async def test_descendants_together_over_the_cpu_limit_are_timeout(
    sandbox: Harness, code: str
) -> None:
    # The wall limit is not what is tested: 60 s, so that only the CPU limit can end the
    # run. With 20 s a loaded steady run (a busy loop per core beside the suite) ended it
    # on the wall clock, the children not yet at 1 CPU-s (not reproduced: 3 of 3 pass in
    # 2.3-3.1 s beside two busy loops).
    result = await sandbox.run(code, cpu_time_s=1, timeout_s=60)
    assert "ATTEMPT" in result.stdout, result
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT, result
    assert result.cpu_time_s > 1.0, result
    await sandbox.assert_healthy()


async def test_anonymous_memory_files_are_refused(sandbox: Harness) -> None:
    # A memfd's pages are in no process's PSS and in no metered mount: without cgroup v2,
    # 64 processes x 256 fds x 16 MiB (RLIMIT_FSIZE) of them would have gone unseen, the
    # run OK. memfd_create is denied (seccomp); /tmp and /dev/shm are tmpfs_bytes each.
    code = """
import os
try:
    os.memfd_create("hoard")
    print("MEMFD OK", flush=True)
except PermissionError:
    print("MEMFD DENIED", flush=True)
"""
    result = await sandbox.run(code)
    assert result.status == sandbox_pb2.EXEC_STATUS_OK, result
    assert "MEMFD DENIED" in result.stdout, result
    bash = await sandbox.run("echo $((6 * 7)) $0", language="bash")  # its script: no memfd
    assert bash.status == sandbox_pb2.EXEC_STATUS_OK and bash.stdout.startswith("42 "), bash
    await sandbox.assert_healthy()


async def test_children_sharing_their_parents_memory_are_counted_once(sandbox: Harness) -> None:
    # The parent touches 100 MiB, then forks 6 children that only read it (shared copy-on-
    # write) and spin 0.1 s each: ~100 MiB and ~0.6 s of CPU in all, under 256 MiB and 2 s.
    # Summing RSS would count 700 MiB; the run is OK because PSS counts shared pages once.
    code = """
import os, time
block = b"\\1" * (100 << 20)
print("ATTEMPT", flush=True)
pids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        assert block[12345] == 1
        while time.process_time() < 0.1:
            pass
        time.sleep(0.5)
        os._exit(0)
    pids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
print("CHILDREN", codes, flush=True)
"""
    result = await sandbox.run(code, memory_bytes=256 * MiB, cpu_time_s=2, timeout_s=20)
    assert result.status == sandbox_pb2.EXEC_STATUS_OK, result
    assert "CHILDREN [0, 0, 0, 0, 0, 0]" in result.stdout
    await sandbox.assert_healthy()


# The cgroup v2 path. This machine has cgroup v1 only (the memory controller is bound to a
# v1 hierarchy, so not even a private cgroup2 mount could hold it): its file protocol is
# checked on a directory laid out like a delegated v2 cgroup, and its readings' effect on
# the status through `to_result`.


def _fake_cgroup(tmp_path: Path, procs: str = "101\n102\n") -> Path:
    own = tmp_path / "sys" / "svc"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("\n")
    (own / "cgroup.procs").write_text(procs)
    return own


def test_cgroup_v2_is_found_from_mounts_and_own_cgroup() -> None:
    mounts = "proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n"
    assert cgroup_v2_mount(mounts) == "/sys/fs/cgroup"
    assert cgroup_v2_mount("cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n") is None
    assert own_cgroup_v2_path("4:memory:/x\n0::/system.slice/rlfleet.service\n") == (
        "/system.slice/rlfleet.service"
    )
    assert own_cgroup_v2_path("4:memory:/process_api/abc\n") is None  # v1 only (here)


def test_cgroup_v2_setup_moves_the_service_into_a_leaf_and_delegates(tmp_path: Path) -> None:
    own = _fake_cgroup(tmp_path)
    root = setup_cgroup_v2(str(tmp_path), "/sys/svc")
    assert root == str(own / "rlfleet-sandboxes")
    # Its processes were moved to the leaf (the kernel empties own/cgroup.procs then).
    assert (own / "rlfleet-service" / "cgroup.procs").read_text() == "102"  # last write
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (own / "rlfleet-sandboxes" / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_cgroup_v2_without_the_memory_controller_is_refused(tmp_path: Path) -> None:
    own = _fake_cgroup(tmp_path)
    (own / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(OSError, match="memory"):
        setup_cgroup_v2(str(tmp_path), "/sys/svc")


def test_sandbox_cgroup_limits_and_readings(tmp_path: Path) -> None:
    cgroup = SandboxCgroup(str(tmp_path / "sandbox-7"))
    os.makedirs(cgroup.path)
    for name, text in {
        "memory.current": "12582912\n",
        "memory.swap.max": "max\n",
        "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n",
        "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
    }.items():
        (tmp_path / "sandbox-7" / name).write_text(text)
    cgroup.baseline_bytes = 12 * MiB
    cgroup.limit(256 * MiB, 64)
    assert (tmp_path / "sandbox-7" / "memory.max").read_text() == str(268 * MiB)
    assert (tmp_path / "sandbox-7" / "memory.swap.max").read_text() == "0"
    assert (tmp_path / "sandbox-7" / "pids.max").read_text() == "66"  # + runner and bwrap
    assert cgroup.oom_kills() == 1 and cgroup.cpu_s() == 2.5


def _limits() -> RunLimits:
    return resolve_limits({"cpu_time_s": 1}, LimitsConfig())


def test_a_cgroup_oom_kill_is_memory_even_when_it_took_the_runner() -> None:
    report = {"op": "done", "exit_code": -1, "signal": 9, "cpu_s": 0.2, "wall_s": 0.3}
    ok = {"op": "done", "exit_code": 0, "signal": 0, "cpu_s": 0.2, "wall_s": 0.3}
    raw = RawRun(report, b"", b"", False, False, False, 0.3, cgroup_oom_kills=1)
    assert to_result(raw, _limits()).status is Status.MEMORY
    runner_gone = RawRun(None, b"", b"", False, False, False, 0.3, cgroup_oom_kills=2)
    assert to_result(runner_gone, _limits()).status is Status.MEMORY
    # cpu.stat over the limit (the runner's own allowance aside) is TIMEOUT even when the
    # program exited 0 before anyone looked; within the allowance it stays OK.
    over = RawRun(ok, b"", b"", False, False, False, 0.3, cgroup_cpu_s=1.6)
    assert to_result(over, _limits()).status is Status.TIMEOUT
    within = RawRun(ok, b"", b"", False, False, False, 0.3, cgroup_cpu_s=1.1)
    assert to_result(within, _limits()).status is Status.OK


def test_runner_reports_of_exceeded_budgets_are_statuses() -> None:
    base = {"op": "done", "exit_code": 0, "signal": 0, "cpu_s": 2.4, "wall_s": 3.0}
    raw = RawRun({**base, "cpu_exceeded": True}, b"", b"", False, False, False, 3.0)
    assert to_result(raw, _limits()).status is Status.TIMEOUT
    raw = RawRun(
        {**base, "cpu_s": 0.1, "memory_error": True, "memory_peak_bytes": 5 << 30},
        b"",
        b"",
        False,
        False,
        False,
        3.0,
    )
    result = to_result(raw, _limits())
    assert result.status is Status.MEMORY and result.extra["memory_peak_bytes"] == 5 << 30


async def test_session_cell_children_together_over_the_memory_limit_are_memory(
    sandbox: Harness,
) -> None:
    session = await sandbox.stub.CreateSession(
        sandbox_pb2.CreateSessionRequest(limits=sandbox_pb2.Limits(memory_bytes=192 * MiB)),
        timeout=10,
    )
    sid = session.session_id
    ok = await sandbox.run("x = 41", session_id=sid, memory_bytes=192 * MiB)
    assert ok.status == sandbox_pb2.EXEC_STATUS_OK, ok
    code = _HOLDERS.format(each=80, children=4, hide=True, hold_s=10)
    result = await sandbox.run(code, session_id=sid, memory_bytes=192 * MiB, timeout_s=20)
    assert "ATTEMPT" in result.stdout, result
    assert result.status == sandbox_pb2.EXEC_STATUS_MEMORY, result
    # A cell whose children share the session's memory copy-on-write is counted once.
    shared = """
import os, time
block = b"\\1" * (60 << 20)
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        time.sleep(0.5)
        os._exit(0)
    pids.append(pid)
print([os.waitpid(pid, 0)[1] for pid in pids])
"""
    result = await sandbox.run(shared, session_id=sid, memory_bytes=192 * MiB, timeout_s=20)
    assert result.status == sandbox_pb2.EXEC_STATUS_OK, result
    assert "[0, 0, 0, 0]" in result.stdout
