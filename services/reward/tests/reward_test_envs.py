"""Environments that misbehave on purpose, registered through `extra_environments`.

They prove the worker pool's safety net, which real verifiers only hit on rare inputs:
`hang` blocks SIGALRM and sleeps (a verifier stuck in C code, where the worker's soft
timeout cannot reach it), `crash` kills its own process, `big` answers with a large result (a job and its result
both larger than a pipe's buffer: the dispatch must not deadlock on them).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment
from rlfleet_reward.types import Sample, Score, binary, scored


class _RowlessEnvironment(Environment):
    """Reads nothing from the row: the response alone says what to do."""

    def parse_row(self, row: Mapping[str, Any]) -> None:
        return None


class _MisbehavesOnItsName(_RowlessEnvironment):
    """Scores 1 (saying which process scored), except that a response equal to the
    environment's name makes it `misbehave`."""

    def score(self, spec: None, sample: Sample) -> Score:
        if sample.text == self.name:
            self.misbehave()
        return binary("ok", True, pid=os.getpid())

    def misbehave(self) -> None:
        raise NotImplementedError


class HangEnvironment(_MisbehavesOnItsName):
    name: ClassVar[str] = "hang"
    description: ClassVar[str] = "test: sleeps with SIGALRM blocked when the response is 'hang'"

    def misbehave(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(120)


class CrashEnvironment(_MisbehavesOnItsName):
    name: ClassVar[str] = "crash"
    description: ClassVar[str] = "test: the worker exits abruptly when the response is 'crash'"

    def misbehave(self) -> None:
        os._exit(3)


class BigEnvironment(_RowlessEnvironment):
    name: ClassVar[str] = "big"
    description: ClassVar[str] = "test: a result with one component per 16 characters of answer"

    def score(self, spec: None, sample: Sample) -> Score:
        if sample.text.startswith("slow"):
            time.sleep(float(sample.text.split()[1]))
        return scored({f"part_{i}": 0.0 for i in range(len(sample.text) // 16)})


class ProbeEnvironment(_RowlessEnvironment):
    """Placed on the event loop. The response is a command: `raise` (the verifier raises),
    `spin S` (S seconds of pure-Python CPU, which a signal can interrupt), `sleep S`,
    `finalizer S` (S seconds of CPU inside a `__del__`, then S more outside it: an alarm
    that lands in the finalizer is swallowed there); the result says which process and
    thread scored it."""

    name: ClassVar[str] = "probe"
    placement = "loop"
    description: ClassVar[str] = "test: runs the command in the response, reports where"

    def score(self, spec: None, sample: Sample) -> Score:
        command, _, arg = sample.text.partition(" ")
        if command == "raise":
            raise ValueError("probe failure")
        if command == "spin":
            _spin(float(arg))
        if command == "sleep":
            time.sleep(float(arg))
        if command == "finalizer":
            spinner = _SpinsWhenCollected(float(arg))
            del spinner  # the last reference: __del__ runs here, inside the check
            _spin(float(arg))
        return binary("ok", True, pid=os.getpid(), thread=threading.current_thread().name)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


class _SpinsWhenCollected:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __del__(self) -> None:
        _spin(self.seconds)


class ThreadProbeEnvironment(ProbeEnvironment):
    """The probe under another name, for `placement.thread_probe=thread`."""

    name: ClassVar[str] = "thread_probe"


class ProcessProbeEnvironment(ProbeEnvironment):
    """The probe under another name, for `placement.process_probe=process`."""

    name: ClassVar[str] = "process_probe"
