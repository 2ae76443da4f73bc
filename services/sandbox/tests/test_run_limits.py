"""Limits bound a whole run, not each process of it (issue 28 item 3): forked children
together over the memory or the CPU limit end the run as MEMORY or TIMEOUT, while a
program whose children stay under the limits together still runs OK. Real bubblewrap,
real service on loopback (the `sandbox` fixture of conftest.py).

Before the fix every process had its own RLIMIT_AS / RLIMIT_CPU: N children could hold N x
memory_bytes and N x cpu_time_s, and the run was reported OK."""

from __future__ import annotations

from rlfleet_proto.v1 import sandbox_pb2
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
    code = _HOLDERS.format(each=80, children=4, hide=True, hold_s=3)
    result = await sandbox.run(code, memory_bytes=192 * MiB, timeout_s=20)
    assert "ATTEMPT" in result.stdout, result
    assert result.status == sandbox_pb2.EXEC_STATUS_MEMORY, result
    assert "ALL DONE" not in result.stdout
    await sandbox.assert_healthy()


async def test_children_together_over_the_cpu_limit_are_timeout(sandbox: Harness) -> None:
    # 3 children each spin 0.8 s of CPU (under the per-process 1 s RLIMIT_CPU), then
    # exit at once: the reaped children's CPU counts too; 2.4 s against a 1 s limit.
    code = """
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
    result = await sandbox.run(code, cpu_time_s=1, timeout_s=20)
    assert "ATTEMPT" in result.stdout, result
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT, result
    assert result.cpu_time_s > 1.0
    await sandbox.assert_healthy()


async def test_many_short_lived_grandchildren_count_toward_the_cpu_limit(
    sandbox: Harness,
) -> None:
    # Orphaned grandchildren (reparented to the runner) that each spin 0.2 s and exit:
    # 10 x 0.2 s, run one after the other, against a 1 s limit.
    code = """
import os, time
print("ATTEMPT", flush=True)
for _ in range(10):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            while time.process_time() < 0.2:
                pass
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.25)
print("ALL DONE", flush=True)
"""
    result = await sandbox.run(code, cpu_time_s=1, timeout_s=20)
    assert "ATTEMPT" in result.stdout, result
    assert result.status == sandbox_pb2.EXEC_STATUS_TIMEOUT, result
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
