"""The verifier worker process: a loop that scores jobs sent over a pipe.

Two timeouts protect the gateway from a verifier that never returns:
- soft (here): SIGALRM raises `VerifierTimeout` inside the verifier after the job's
  budget. It derives from BaseException so that verifiers' own `except Exception`
  blocks (math-verify has several) cannot swallow it into a silent "wrong answer";
- hard (in the pool): a worker that has not answered a little after the budget is stuck
  in C code where signals are not delivered (a huge integer power); the pool kills and
  replaces it.
Either way the caller gets an explicit TIMEOUT failure, never a 0.

Imported by the forkserver before any worker is forked (see pool.py), so this module
must stay cheap to import; the heavy verifier libraries are preloaded separately.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any

from rlfleet_reward.environments import get_environment, register_environment
from rlfleet_reward.types import FailureKind, Sample, Score, failure


class VerifierTimeout(BaseException):
    """Raised in a worker when the soft timeout of the current job expires."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise VerifierTimeout


def preload(module_names: list[str]) -> None:
    """Import verifier libraries (in the forkserver, so forked workers start warm)."""
    import importlib

    warnings.filterwarnings("ignore", category=SyntaxWarning)
    for name in module_names:
        try:
            importlib.import_module(name)
        except ImportError:  # the worker will report the env's own import error per job
            logging.getLogger(__name__).warning("cannot preload %s", name)


def run_job(env_name: str, spec: Any, sample: Sample, soft_deadline: float) -> Score:
    """Score one job under the soft timeout (`soft_deadline` is a time.monotonic() value,
    the same clock in every process); every outcome is a Score."""
    start = time.perf_counter()
    soft_timeout_s = soft_deadline - time.monotonic()
    if soft_timeout_s <= 0:
        return failure(
            FailureKind.TIMEOUT, f"{env_name} job waited past its budget before it could start"
        )
    try:
        signal.setitimer(signal.ITIMER_REAL, soft_timeout_s)
        try:
            score = get_environment(env_name).score(spec, sample)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        score.info["verify_s"] = (
            f"{time.perf_counter() - start:.4f}"  # worker time, without queueing
        )
        return score
    except VerifierTimeout:
        return failure(
            FailureKind.TIMEOUT,
            f"{env_name} verifier ran longer than {soft_timeout_s:.2f}s and was stopped",
        )
    except Exception as exc:
        return failure(
            FailureKind.VERIFIER_ERROR, f"{env_name} verifier raised {type(exc).__name__}: {exc}"
        )


def worker_main(
    conn: Connection,
    env_names: list[str],
    preload_modules: list[str],
    extra_environments: dict[str, str],
) -> None:
    """Entry point of a worker process: warm up, say ready, then serve jobs until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gateway decides when workers stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, _on_alarm)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    preload(preload_modules)
    for name, path in extra_environments.items():
        register_environment(name, path)
    for name in env_names:
        get_environment(name)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        job_id, env_name, spec, sample, soft_deadline = message
        try:
            result = run_job(env_name, spec, sample, soft_deadline)
        except VerifierTimeout:  # the alarm fired between the verifier's return and the reset
            result = failure(FailureKind.TIMEOUT, f"{env_name} verifier hit its time limit")
        conn.send((job_id, result))
