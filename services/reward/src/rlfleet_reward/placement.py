"""Where an environment's `score` runs: on the event loop, in a thread, or in a worker process.

A verifier that costs ~0.1 ms (a JSON schema check) paid ~10 ms of process round trip
and queueing in the worker pool, and lost to NeMo-Gym's single-process server. So each
environment names a default placement (`Environment.placement`, chosen from its measured
cost per answer: docs/reward.md) and the gateway's `placement.<env>` config overrides it:

- `loop`: called synchronously on the gateway's event loop, for sub-millisecond checks.
  Every call runs under a wall-clock guard (`pool.inline_budget_s`): SIGALRM interrupts a
  check that overruns it, and the answer is scored again in a worker process with what is
  left of its budget, so the loop stalls at most that long and the verdict is the one the
  pool would give. The guard needs the loop on the main thread (where Python runs signal
  handlers), which is where the service runs it; elsewhere `loop` falls back to `process`.
  It cannot interrupt one long C call, so an environment may only be placed here when its
  C calls are bounded (docs/reward.md lists what bounds each).
- `thread`: a bounded thread pool (`pool.threads`), for work that releases the GIL or
  costs a few ms. A thread cannot be killed: past its budget the caller gets a TIMEOUT
  failure, and the thread's slot stays taken until the check returns.
- `process`: the killable worker pool (pool.py), for anything unbounded (sympy).

Whatever the placement, a verifier's exception is a VERIFIER_ERROR failure with its reason
and an overrun is a TIMEOUT failure, never an error reply or a silent 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rlfleet_reward import metrics
from rlfleet_reward.environments import get_environment
from rlfleet_reward.environments.base import PLACEMENTS, Placement
from rlfleet_reward.types import FailureKind, Overloaded, Sample, Score, failure

# Environments whose `score` keeps per-call state in module globals, so two threads would
# share it: structured_outputs' regex CPU budget (`_TIMED_RE.deadline`) is one per process.
NOT_THREAD_SAFE: dict[str, str] = {
    "structured_outputs": "its regex CPU budget is process-global state (use loop or process)"
}


def check_placements(overrides: dict[str, str], known: list[str]) -> None:
    """ValueError naming the entry unless each `placement.<env>` is a known env and value."""
    for env, where in overrides.items():
        if env not in known:
            raise ValueError(
                f"placement.{env}: unknown or not served environment; served: {', '.join(known)}"
            )
        if where not in PLACEMENTS:
            raise ValueError(
                f"placement.{env}: must be one of {', '.join(PLACEMENTS)}, got {where!r}"
            )
        if where == "thread" and env in NOT_THREAD_SAFE:
            raise ValueError(f"placement.{env}: cannot be thread, {NOT_THREAD_SAFE[env]}")


def call_score(env_name: str, spec: Any, sample: Sample) -> Score:
    """`score` with every exception turned into a VERIFIER_ERROR failure, and its time in
    `info.verify_s`, as a worker reports them."""
    start = time.perf_counter()
    try:
        score = get_environment(env_name).score(spec, sample)
        score.info["verify_s"] = f"{time.perf_counter() - start:.4f}"
        return score
    except Exception as exc:
        return failure(
            FailureKind.VERIFIER_ERROR, f"{env_name} verifier raised {type(exc).__name__}: {exc}"
        )


class _Overrun(BaseException):
    """Raised by SIGALRM inside an inline check that ran past its guard. A BaseException,
    so that a verifier's own `except Exception` cannot swallow it."""


def _drop_swallowed_overruns(previous: Any) -> Any:
    """An unraisable-exception hook that drops `_Overrun`s and passes the rest on.

    An alarm that lands while a finalizer (`__del__`, a weakref callback) runs, as the
    garbage collector may start one in the middle of any check, raises inside the
    finalizer. Python cannot propagate that exception: it prints it as "Exception ignored
    in ..." and goes on. The guard's timer repeats, so the next alarm interrupts the check,
    and the print was only noise (a traceback in the service log)."""

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, _Overrun):
            previous(unraisable)

    hook.drops_overruns = True  # type: ignore[attr-defined]
    return hook


class InlineRunner:
    """Runs `score` on the calling (event-loop) thread under a SIGALRM wall-clock guard."""

    def __init__(self) -> None:
        self._active = False
        self.available = threading.current_thread() is threading.main_thread()
        if self.available:
            signal.signal(signal.SIGALRM, self._on_alarm)
            if not getattr(sys.unraisablehook, "drops_overruns", False):
                sys.unraisablehook = _drop_swallowed_overruns(sys.unraisablehook)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self._active:  # a late alarm after the check returned is ignored
            raise _Overrun

    def usable(self) -> bool:
        return self.available and threading.current_thread() is threading.main_thread()

    def run(self, env_name: str, spec: Any, sample: Sample, guard_s: float) -> Score | None:
        """The verdict, or None when the check ran past `guard_s` and was interrupted."""
        self._active = True  # before the timer: an alarm must never find the flag down
        try:
            # Repeating: an alarm swallowed by a finalizer (above) is raised again one
            # guard later, so no check outlives its guard by more than that.
            signal.setitimer(signal.ITIMER_REAL, guard_s, guard_s)
            try:
                return call_score(env_name, spec, sample)
            finally:
                self._active = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _Overrun:
            return None
        finally:
            self._active = False
            signal.setitimer(signal.ITIMER_REAL, 0)  # an alarm in the cleanup above skipped it


class ThreadRunner:
    """A bounded thread pool; at most `max_queue` checks wait or run beyond its threads."""

    def __init__(self, threads: int, max_queue: int) -> None:
        self.threads = threads
        self.max_queue = max_queue
        self._executor: ThreadPoolExecutor | None = None
        self._pending = 0  # submitted and not yet returned (a timed-out check still counts)

    def reserve(self, n: int) -> None:
        if self._pending + n > self.threads + self.max_queue:
            metrics.REJECTED.labels("overloaded").inc(n)
            raise Overloaded(
                f"verifier threads full ({self._pending} checks pending, limit "
                f"{self.threads + self.max_queue}); retry later"
            )

    def _done(self, _: Future[Score]) -> None:
        self._pending -= 1  # called in the loop's thread (call_soon_threadsafe below)

    def _done_threadsafe(self, loop: asyncio.AbstractEventLoop, future: Future[Score]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the check ran on
            loop.call_soon_threadsafe(self._done, future)

    async def submit(self, env_name: str, spec: Any, sample: Sample, timeout_s: float) -> Score:
        self.reserve(1)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="rlfleet-verify")
        loop = asyncio.get_running_loop()
        future = self._executor.submit(call_score, env_name, spec, sample)
        self._pending += 1
        future.add_done_callback(lambda f: self._done_threadsafe(loop, f))
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.wrap_future(future)
        except TimeoutError:
            return failure(
                FailureKind.TIMEOUT,
                f"{env_name} verifier (thread) did not finish within {timeout_s:.2f}s",
            )

    def stop(self) -> None:
        if self._executor is not None:
            # Threads cannot be stopped; those still running finish on their own.
            self._executor.shutdown(wait=False, cancel_futures=True)


def resolve(env_name: str, default: Placement, overrides: dict[str, str]) -> Placement:
    where = overrides.get(env_name, default)
    assert where in PLACEMENTS, where  # checked by config / check_placements
    return where  # type: ignore[return-value]
