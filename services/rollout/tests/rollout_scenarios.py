"""Runs a pool test's scenario in its own process session, so the Ray processes it starts
die with it (killed as a group) when it hangs, instead of leaking past the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest


def run_scenario(script: str, *args: str, timeout_s: float) -> str:
    """Run `python script *args`; its output, after checking it exited 0 and printed
    "scenario passed". `timeout_s` is the scenario's own budget: its imports and exit get
    another 60 s before the whole session is killed."""
    proc = subprocess.Popen(
        [sys.executable, script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"scenario still running after {timeout_s + 60:g}s:\n{out[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    assert "scenario passed" in out
    return out
