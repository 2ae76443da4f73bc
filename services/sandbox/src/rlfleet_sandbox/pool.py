"""The warm pool: `size` one-shot sandboxes started ahead of demand.

Why reuse, not one sandbox per run: a new sandbox costs a bwrap setup plus an
interpreter start (~80 ms wall, ~30 ms CPU here), more CPU than the bare
`python -c` it should compete with, so on a busy machine a use-once pool cannot even
match the baseline. A resident runner forks a fresh process per run (~1 ms) instead, and
between runs kills every process of the sandbox and wipes its tmpfs, SysV IPC and
keyrings (runner.scrub); the runner never holds a program's code, input or output, so
nothing of one run is in the memory the next one is forked from. A sandbox is replaced
after `max_runs_per_sandbox` runs, and at once when a run leaves it in doubt (killed
past its deadline, runner rlimits changed, runner dead). `max_runs_per_sandbox=1` gives a
brand-new sandbox per run for those who prefer that trade.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from rlfleet_core.errors import ResourceExhausted, Unavailable

from rlfleet_sandbox.config import PoolConfig
from rlfleet_sandbox.metrics import POOL_IDLE, POOL_WAITING, RETIRED, SPAWNS
from rlfleet_sandbox.sandbox import RawRun, SandboxHandle, SandboxStartError, Spawner
from rlfleet_sandbox.types import ExecRequest

logger = logging.getLogger(__name__)

_RESPAWN_BACKOFF_S = (0.05, 0.2, 1.0, 5.0)
_BROKEN_CHECK_S = 1.0  # how often a waiting run checks whether any sandbox can still come


class WarmPool:
    def __init__(self, spawn: Spawner, config: PoolConfig) -> None:
        self._spawn_one = spawn
        self._config = config
        self._idle: asyncio.Queue[SandboxHandle] = asyncio.Queue()
        self._busy: set[SandboxHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting = 0
        self._closed = False
        self.last_error: str | None = None

    async def start(self) -> None:
        """Fill the pool; the first failure aborts start-up (isolation does not work here,
        and serving without it is not an option)."""
        sandboxes = await asyncio.gather(
            *(self._spawn() for _ in range(self._config.size)), return_exceptions=True
        )
        errors = [s for s in sandboxes if isinstance(s, BaseException)]
        for sandbox in sandboxes:
            if not isinstance(sandbox, BaseException):
                self._idle.put_nowait(sandbox)
        POOL_IDLE.set(self._idle.qsize())
        if errors:
            await self.stop()
            raise errors[0]

    async def _spawn(self) -> SandboxHandle:
        try:
            sandbox = await self._spawn_one("oneshot", None)
        except SandboxStartError as exc:
            SPAWNS.labels("oneshot", "error").inc()
            self.last_error = str(exc)
            raise
        SPAWNS.labels("oneshot", "ok").inc()
        self.last_error = None
        return sandbox

    async def run(self, request: ExecRequest) -> RawRun:
        """Run `request` in a warm sandbox, waiting for one if all are busy. A run whose
        Ray node was lost before it answered (ray_pool.py) goes once more to another
        sandbox (the lost one is replaced on a live node); a second loss is reported."""
        raw = await self._run_once(request)
        if raw.node_lost:
            logger.warning("sandbox node lost mid-run; running it again on another sandbox")
            raw = await self._run_once(request)
        return raw

    async def _run_once(self, request: ExecRequest) -> RawRun:
        if self._closed:
            raise Unavailable("sandbox pool is shutting down")
        if self._idle.empty() and not self._busy and not self._tasks and self.last_error:
            raise Unavailable(f"no sandbox can be started: {self.last_error}")
        if self._idle.empty() and self._waiting >= self._config.max_waiting:
            raise ResourceExhausted(
                f"{self._waiting} runs already wait for a sandbox (pool.max_waiting); retry later"
            )
        self._waiting += 1
        POOL_WAITING.set(self._waiting)
        try:
            sandbox = await self._next_idle()
            while not sandbox.alive:  # its node was lost while it waited: replace it
                RETIRED.labels("unhealthy").inc()
                self._track(self._replace(sandbox))
                sandbox = await self._next_idle()
        finally:
            self._waiting -= 1
            POOL_WAITING.set(self._waiting)
            POOL_IDLE.set(self._idle.qsize())
        self._busy.add(sandbox)
        try:
            return await sandbox.run(request, self._config.kill_grace_s)
        finally:
            self._busy.discard(sandbox)
            self._give_back(sandbox)

    async def _next_idle(self) -> SandboxHandle:
        """The next idle sandbox; Unavailable once none is left, none is running and every
        replacement has given up (no waiting on until the caller's deadline)."""
        while True:
            try:
                return await asyncio.wait_for(self._idle.get(), _BROKEN_CHECK_S)
            except TimeoutError:
                if not self._busy and not self._tasks and self.last_error:
                    raise Unavailable(f"no sandbox can be started: {self.last_error}") from None

    def _give_back(self, sandbox: SandboxHandle) -> None:
        if self._closed:
            self._track(sandbox.kill())
        elif sandbox.alive and sandbox.runs < self._config.max_runs_per_sandbox:
            self._idle.put_nowait(sandbox)
            POOL_IDLE.set(self._idle.qsize())
        else:
            RETIRED.labels("max_runs" if sandbox.alive else "unhealthy").inc()
            self._track(self._replace(sandbox))

    async def _replace(self, old: SandboxHandle) -> None:
        await old.kill()
        for attempt, backoff_s in enumerate((*_RESPAWN_BACKOFF_S, None)):
            if self._closed:
                return
            try:
                sandbox = await self._spawn()
            except SandboxStartError:
                logger.error(
                    "cannot start a sandbox (attempt %d): %s", attempt + 1, self.last_error
                )
                if backoff_s is None:
                    return
                await asyncio.sleep(backoff_s)
                continue
            if self._closed:
                await sandbox.kill()
                return
            self._idle.put_nowait(sandbox)
            POOL_IDLE.set(self._idle.qsize())
            return

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def idle(self) -> int:
        return self._idle.qsize()

    async def stop(self) -> None:
        """Kill every sandbox, idle and busy (a busy run ends with SANDBOX_ERROR)."""
        self._closed = True
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        kills = []
        while not self._idle.empty():
            kills.append(self._idle.get_nowait().kill())
        kills += [sandbox.kill() for sandbox in self._busy]
        await asyncio.gather(*kills)
        RETIRED.labels("shutdown").inc(len(kills))
        POOL_IDLE.set(0)
