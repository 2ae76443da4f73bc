"""Warm verifier worker processes with per-job timeouts, kill-and-replace, and a bounded queue.

Why not concurrent.futures.ProcessPoolExecutor: it cannot stop one hung task — the only
remedy is to tear down the whole pool, failing every job in flight. Here each worker is
owned by one asyncio "slot" task that talks to it over a socketpair driven by the event
loop (no thread per call). A worker that misses its deadline is SIGKILLed and replaced
while the other slots keep serving.

Dispatch never blocks the event loop, which also serves gRPC and HTTP: a job is handed to
the socket's asyncio transport, which writes it as fast as the worker reads, and results
are read concurrently. A blocking `Connection.send` here once froze /healthz while a 5 MB
answer waited behind a slow job, and deadlocked for good when the gateway was writing a
large job while the worker was writing a large result (each waiting for the other to read).
The worker end stays a plain blocking `multiprocessing.connection.Connection`; the
gateway end speaks the same framing (`_frame`, `_Worker.recv`).

Workers are forked from a forkserver that has already imported the verifier libraries
(math-verify + sympy take ~4 s to import, reasoning-gym ~7 s): a replacement is ready in
milliseconds, and the gateway's own process (gRPC threads) is never forked.

Back-pressure: at most `max_queue` jobs wait; beyond that `submit` raises `Overloaded`,
which the faces turn into RESOURCE_EXHAUSTED / HTTP 429 at once, instead of letting
latency grow without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import pickle
import socket
import struct
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any

from rlfleet_reward import metrics
from rlfleet_reward.types import FailureKind, Overloaded, Sample, Score, failure
from rlfleet_reward.worker import worker_main

logger = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0  # first start may import reasoning-gym in a cold forkserver
_PREFETCH = 2  # jobs in a worker's pipe: the running one and the next
_READ_LIMIT = 1 << 20  # read buffer per worker socket: results up to ~this arrive in one go
_RETIRE_S = 2.0  # a worker asked to exit gets this long before it is killed


@dataclass
class _Job:
    job_id: int
    env: str
    spec: Any
    sample: Sample
    deadline: float  # time.monotonic()
    future: asyncio.Future[Score]
    enqueued: float = field(default_factory=time.monotonic)


def _frame(message: Any) -> tuple[bytes, memoryview]:
    """`message` framed as `multiprocessing.connection.Connection.send` frames it."""
    payload = ForkingPickler.dumps(message)
    n = len(payload)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return header, payload


@dataclass
class _Worker:
    process: BaseProcess
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def send(self, message: Any) -> None:
        """Queue `message` for the worker and return at once: the transport writes it as
        the worker reads, while `recv` keeps draining results (no write-write deadlock).
        Buffered bytes are bounded by `_PREFETCH` jobs, each bounded by `limits.*`."""
        for part in _frame(message):
            self.writer.write(part)

    async def recv(self) -> Any:
        """The next message from the worker; EOFError (IncompleteReadError) if it is gone."""
        (n,) = struct.unpack("!i", await self.reader.readexactly(4))
        if n == -1:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        return pickle.loads(await self.reader.readexactly(n))

    def abort(self) -> None:
        """Drop the connection now, discarding anything not yet written."""
        self.writer.transport.abort()


class VerifierPool:
    """`size` worker processes scoring jobs from one bounded queue."""

    def __init__(
        self,
        size: int,
        *,
        max_queue: int,
        kill_grace_s: float,
        env_names: list[str],
        preload_modules: list[str],
        extra_environments: dict[str, str] | None = None,
        start_method: str = "forkserver",
    ) -> None:
        if size < 1:
            raise ValueError(f"size ({size}) must be >= 1")
        self.size = size
        self.max_queue = max_queue
        self.kill_grace_s = kill_grace_s
        self.env_names = env_names
        self.preload_modules = preload_modules
        self.extra_environments = extra_environments or {}
        self._ctx: Any = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # Per process, the first pool to start the forkserver decides what it preloads;
            # a later pool with other environments still works, its workers import more.
            self._ctx.set_forkserver_preload(["rlfleet_reward.worker", *preload_modules])
        self._queue: asyncio.Queue[_Job] = asyncio.Queue()
        self._workers: list[_Worker | None] = [None] * size
        self._tasks: list[asyncio.Task[None]] = []
        self._ids = itertools.count()
        self._busy_slots: set[int] = set()
        self._closed = False
        self.restarts = 0

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        self._workers = list(workers)
        self._tasks = [
            asyncio.create_task(self._serve(i), name=f"verifier-slot-{i}") for i in range(self.size)
        ]
        metrics.POOL_WORKERS.set(self.size)

    async def stop(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_result(
                    failure(FailureKind.OVERLOADED, "reward service is shutting down")
                )
        await asyncio.gather(*(self._retire(w) for w in self._workers if w is not None))
        self._workers = [None] * self.size
        metrics.POOL_WORKERS.set(0)

    async def _spawn(self) -> _Worker:
        """Start one worker and wait for its ready message."""
        parent_sock, child_sock = socket.socketpair()
        child = Connection(child_sock.detach())
        process = self._ctx.Process(
            target=worker_main,
            args=(child, self.env_names, self.preload_modules, self.extra_environments),
            daemon=True,
            name="rlfleet-verifier",
        )
        try:
            await asyncio.to_thread(process.start)  # talks to the forkserver: blocking
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child.close()
        reader, writer = await asyncio.open_connection(sock=parent_sock, limit=_READ_LIMIT)
        worker = _Worker(process, reader, writer)
        try:
            await asyncio.wait_for(worker.recv(), _READY_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            worker.abort()
            raise RuntimeError(
                f"verifier worker did not start within {_READY_TIMEOUT_S:.0f}s"
            ) from None
        except (EOFError, OSError):
            worker.abort()
            await asyncio.to_thread(process.join, 5.0)
            raise RuntimeError(
                f"verifier worker exited during start-up (exit code {process.exitcode})"
            ) from None
        return worker

    @staticmethod
    async def _retire(worker: _Worker) -> None:
        """Ask a worker to exit; kill it if it has not within `_RETIRE_S`."""
        if not worker.writer.is_closing():
            worker.send(None)
            worker.writer.close()  # EOF once the buffer is written: the worker exits on it
        await asyncio.to_thread(worker.process.join, _RETIRE_S)
        if worker.process.is_alive():
            worker.process.kill()
            await asyncio.to_thread(worker.process.join, _RETIRE_S)
        worker.abort()

    async def _replace(self, slot: int, reason: str) -> None:
        self.restarts += 1
        metrics.POOL_RESTARTS.labels(reason).inc()
        logger.warning("verifier worker replaced", extra={"slot": slot, "reason": reason})
        old = self._workers[slot]
        self._workers[slot] = None
        if old is not None:
            old.process.kill()
            old.abort()
            await asyncio.to_thread(old.process.join, 5.0)
        while True:  # a slot must not die with its worker: keep trying, loudly
            try:
                self._workers[slot] = await self._spawn()
                return
            except (RuntimeError, OSError) as exc:
                logger.error(
                    "cannot start a verifier worker; retrying in 1s",
                    extra={"slot": slot, "error": str(exc)},
                )
                await asyncio.sleep(1.0)

    # --- jobs ----------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    def reserve(self, n: int) -> None:
        """Raise Overloaded unless `n` more jobs fit in the queue (a group is all or nothing)."""
        if self._closed:
            raise Overloaded("reward service is shutting down")
        if self._queue.qsize() + n > self.max_queue:
            metrics.REJECTED.labels("overloaded").inc(n)
            raise Overloaded(
                f"verifier queue full ({self._queue.qsize()} waiting, limit {self.max_queue}); retry later"
            )

    async def submit(self, env: str, spec: Any, sample: Sample, timeout_s: float) -> Score:
        """Score in a worker; the verdict (or a TIMEOUT failure) arrives within `timeout_s`,
        queue wait, a hung worker's kill and its failure included."""
        self.reserve(1)
        job = _Job(
            next(self._ids),
            env,
            spec,
            sample,
            time.monotonic() + timeout_s,
            asyncio.get_running_loop().create_future(),
        )
        self._queue.put_nowait(job)
        metrics.POOL_QUEUE.set(self._queue.qsize())
        return await job.future

    def _next_job(self) -> _Job | None:
        """A queued job that still wants an answer, answering expired ones; None if none waits."""
        while not self._queue.empty():
            job = self._queue.get_nowait()
            metrics.POOL_QUEUE.set(self._queue.qsize())
            if job.future.done():  # the caller gave up (deadline, cancellation)
                continue
            if job.deadline <= time.monotonic():
                job.future.set_result(
                    failure(
                        FailureKind.TIMEOUT,
                        f"waited {time.monotonic() - job.enqueued:.2f}s in the verifier "
                        "queue and ran out of time before a worker was free",
                    )
                )
                continue
            return job
        return None

    async def _serve(self, slot: int) -> None:
        """Feed one worker. Up to `_PREFETCH` jobs sit in its pipe, so it starts the next job
        the moment it finishes one instead of idling until this (busy, shared-core) process
        is scheduled to send it; results come back in order and the oldest job is the one
        running."""
        inflight: deque[_Job] = deque()  # sent, in order; inflight[0] is running
        unsent: deque[_Job] = deque()  # taken back from a replaced worker, not yet started
        try:
            while True:
                while len(inflight) < _PREFETCH:
                    job = unsent.popleft() if unsent else self._next_job()
                    if job is None and not inflight:
                        job = await self._queue.get()
                        metrics.POOL_QUEUE.set(self._queue.qsize())
                        if job.future.done():
                            continue
                    if job is None:
                        break
                    if not await self._send(slot, job):
                        unsent.appendleft(job)
                        continue
                    inflight.append(job)
                self._set_busy(slot, True)
                result, replace_reason = await self._await_oldest(slot, inflight[0])
                job = inflight.popleft()
                if not job.future.done():
                    job.future.set_result(result)
                if replace_reason is not None:
                    # The jobs behind it never started: run them on the replacement. Answer
                    # first, replace after: the caller must not wait for a respawn.
                    unsent.extendleft(reversed(inflight))
                    inflight.clear()
                    await self._replace(slot, replace_reason)
                if not inflight and not unsent:
                    self._set_busy(slot, False)
        except asyncio.CancelledError:  # stop(): answer everything this slot holds
            for job in (*inflight, *unsent):
                if not job.future.done():
                    job.future.set_result(
                        failure(FailureKind.OVERLOADED, "reward service is shutting down")
                    )
            raise

    def _set_busy(self, slot: int, busy: bool) -> None:
        if busy:
            self._busy_slots.add(slot)
        else:
            self._busy_slots.discard(slot)
        metrics.POOL_BUSY.set(len(self._busy_slots))

    async def _send(self, slot: int, job: _Job) -> bool:
        """Send `job` to the slot's worker (replacing a dead one first); False if the pipe broke."""
        worker = self._workers[slot]
        if worker is None or not worker.process.is_alive():
            await self._replace(slot, "dead")
            worker = self._workers[slot]
        assert worker is not None
        if worker.writer.is_closing():  # the connection broke (the worker died)
            await self._replace(slot, "dead")
            return False
        worker.send((job.job_id, job.env, job.spec, job.sample, self.soft_deadline(job)))
        return True

    async def _await_oldest(self, slot: int, job: _Job) -> tuple[Score, str | None]:
        """(verdict of the running job, reason to replace the worker or None)."""
        worker = self._workers[slot]
        assert worker is not None
        try:
            job_id, result = await asyncio.wait_for(
                worker.recv(), max(0.0, job.deadline - time.monotonic())
            )
        except TimeoutError:
            worker.process.kill()  # now, so it stops burning a core while we answer
            budget = job.deadline - job.enqueued
            return failure(
                FailureKind.TIMEOUT,
                f"{job.env} verifier hung past its {budget:.2f}s budget; "
                "its worker was killed and replaced",
            ), "timeout"
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            await asyncio.to_thread(worker.process.join, 2.0)  # reap it, to report its exit code
            return failure(
                FailureKind.VERIFIER_ERROR,
                f"{job.env} verifier worker died "
                f"(exit code {worker.process.exitcode}, {type(exc).__name__})",
            ), "crash"
        if job_id != job.job_id:  # results come back in send order; be loud if they do not
            return failure(
                FailureKind.VERIFIER_ERROR, f"worker answered job {job_id}, expected {job.job_id}"
            ), "protocol"
        score: Score = result
        return score, None

    def soft_deadline(self, job: _Job) -> float:
        """When the worker's own (signal) timeout fires for `job` (time.monotonic, which all
        processes share): early enough that a worker which ignores it can still be killed,
        and the failure delivered, by the job's deadline."""
        budget_s = job.deadline - time.monotonic()
        if budget_s > 2 * self.kill_grace_s:
            return job.deadline - self.kill_grace_s
        return job.deadline - budget_s / 2
