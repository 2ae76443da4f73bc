"""The test double sandbox must not leak processes: the code harness forks, and a
candidate that spins in a child would otherwise outlive the test run (it did: two
orphans kept two cores busy for the rest of a CI run)."""

from __future__ import annotations

import os
import time

from rlfleet_proto.v1 import sandbox_pb2
from sandbox_double import SubprocessSandbox

FORKS_A_SPINNER = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        pass
print(pid, flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_child_does_not_outlive_the_call() -> None:
    # The child holds stdout open, so the call ends at its timeout either way.
    for code in (FORKS_A_SPINNER, FORKS_A_SPINNER + "os._exit(0)"):
        request = sandbox_pb2.ExecuteRequest(
            language=sandbox_pb2.LANGUAGE_PYTHON, code=code, limits=sandbox_pb2.Limits(timeout_s=1)
        )
        result = SubprocessSandbox().Execute(request, None)  # type: ignore[abstract, arg-type]
        child = int(result.stdout.split()[0])
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(child):
            os.kill(child, 9)
            raise AssertionError(f"the forked child {child} outlived the call: {result}")
