"""Sandboxes spread over a Ray cluster (`pool.backend=ray`), for a service whose runs
outgrow one node.

Each Ray actor (`SandboxNode`) is a node agent: it builds the `SandboxSpec` on its own
node (the bwrap, seccomp and bind paths found there) and starts, runs and kills
ordinary bubblewrap sandboxes (sandbox.py), so isolation is exactly that of the process
mode. The service keeps the warm pool and the sessions (pool.py, sessions.py) and hands
them `RemoteSandbox` handles in place of local ones: a session holds its sandbox's
handle, so all of its cells go to the actor (the node) that holds its interpreter.

New sandboxes go to the live actor holding the fewest. Every call on an actor has a
deadline (a run's: its time limit + the kill grace + `ray.call_timeout_s`). An actor
that is lost (its process or its node died) is taken out of rotation: the sandboxes it
held count as dead, a one-shot run on it is run once more on another node (pool.py), a
session's next cell starts a fresh interpreter elsewhere (reported as a session reset),
and when no actor is left, starting a sandbox fails with a message that says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

from rlfleet_core import raycluster
from rlfleet_core.raycluster import RayConfig

from rlfleet_sandbox.config import IsolationConfig
from rlfleet_sandbox.sandbox import RawRun, Sandbox, SandboxSpec, SandboxStartError
from rlfleet_sandbox.types import ExecRequest

logger = logging.getLogger(__name__)


class SandboxNode:
    """Body of one Ray actor: the sandboxes of one node (made a Ray actor class lazily)."""

    def __init__(self, isolation: IsolationConfig) -> None:
        self.isolation = isolation
        self.spec: SandboxSpec | None = None
        self.sandboxes: dict[int, Sandbox] = {}
        self.ids = itertools.count()

    async def start(self) -> str:
        self.spec = SandboxSpec.from_config(self.isolation)
        return raycluster.node_id()

    async def spawn(self, mode: str, session_limits: dict[str, Any] | None) -> int | str:
        """A new sandbox's id, or why it could not start (a string)."""
        assert self.spec is not None
        try:
            sandbox = await Sandbox.spawn(self.spec, mode, session_limits)
        except SandboxStartError as exc:
            return str(exc)
        sandbox_id = next(self.ids)
        self.sandboxes[sandbox_id] = sandbox
        return sandbox_id

    async def run(
        self, sandbox_id: int, request: ExecRequest, backstop_s: float
    ) -> tuple[RawRun, bool]:
        """The run and whether the sandbox is still alive after it."""
        sandbox = self.sandboxes[sandbox_id]
        raw = await sandbox.run(request, backstop_s)
        return raw, sandbox.alive

    async def kill(self, sandbox_id: int) -> None:
        sandbox = self.sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.kill()

    async def stop(self) -> None:
        sandboxes, self.sandboxes = list(self.sandboxes.values()), {}
        await asyncio.gather(*(s.kill() for s in sandboxes), return_exceptions=True)


class RemoteSandbox:
    """A `SandboxHandle` for one sandbox held by a `SandboxNode` actor."""

    def __init__(self, nodes: RaySandboxes, index: int, sandbox_id: int) -> None:
        self.nodes = nodes
        self.index = index
        self.sandbox_id = sandbox_id
        self.runs = 0
        self.healthy = True

    @property
    def node(self) -> str:
        return self.nodes.node_ids[self.index]

    @property
    def alive(self) -> bool:
        return self.healthy and self.index not in self.nodes.lost

    async def run(self, request: ExecRequest, backstop_s: float) -> RawRun:
        self.runs += 1
        actor = self.nodes.actors[self.index]
        limit = request.limits.timeout_s + backstop_s + self.nodes.config.call_timeout_s
        start = time.monotonic()
        try:
            ref = actor.run.remote(self.sandbox_id, request, backstop_s)
            raw, alive = await asyncio.wait_for(raycluster.as_future(ref), limit)
        except TimeoutError:
            self.healthy = False
            why = f"did not answer within {limit:.1f}s"
        except Exception as exc:
            if not raycluster.is_actor_lost(exc):
                raise
            self.healthy = False
            self.nodes.mark_lost(self.index, exc)
            why = f"was lost ({type(exc).__name__})"
        else:
            self.healthy = alive
            assert isinstance(raw, RawRun)
            raw.node = self.node[:12]
            return raw
        note = f"\n[sandbox] the sandbox's Ray node {self.node[:12]} {why}\n"
        logger.error("sandbox on Ray node %s %s", self.node[:12], why)
        return RawRun(
            None,
            b"",
            note.encode(),
            stdout_overflow=False,
            stderr_overflow=False,
            backstop_killed=False,
            wall_s=time.monotonic() - start,
            node_lost=True,
            node=self.node[:12],
        )

    async def kill(self) -> None:
        if self.index in self.nodes.lost:
            return  # died with its node (bwrap runs with --die-with-parent)
        self.healthy = False
        with contextlib.suppress(Exception):  # a lost actor: nothing left to kill
            await asyncio.wait_for(
                raycluster.as_future(self.nodes.actors[self.index].kill.remote(self.sandbox_id)),
                self.nodes.config.call_timeout_s,
            )
        self.nodes.held[self.index] -= 1


class RaySandboxes:
    """The `SandboxNode` actors of one service, and the `Spawner` the pool and the
    sessions use (`spawn`)."""

    def __init__(self, config: RayConfig, isolation: IsolationConfig) -> None:
        self.config = config
        self.isolation = isolation
        self._spread = raycluster.SpreadActors(config)
        self.held: list[int] = []
        """Sandboxes started and not killed, per actor."""
        self.lost: set[int] = set()

    @property
    def actors(self) -> list[Any]:
        return self._spread.actors

    @property
    def node_ids(self) -> list[str]:
        return self._spread.node_ids

    async def start(self) -> None:
        """Join Ray, place the actors and start them, all within `ray.start_timeout_s`;
        on failure everything started so far is torn down."""
        await self._spread.start(SandboxNode, self.isolation, what="Ray sandbox nodes")
        self.held = [0] * len(self.actors)
        logger.info(
            "Ray sandbox actors ready: %d on %d nodes", len(self.actors), len(set(self.node_ids))
        )

    def mark_lost(self, index: int, exc: BaseException) -> None:
        if index not in self.lost:
            self.lost.add(index)
            logger.error(
                "Ray sandbox actor %d on node %s lost (%s); %d left",
                index,
                self.node_ids[index][:12],
                type(exc).__name__,
                len(self.actors) - len(self.lost),
            )

    async def spawn(self, mode: str, session_limits: dict[str, Any] | None) -> RemoteSandbox:
        """A new sandbox on the live actor holding the fewest; SandboxStartError when none
        can start one."""
        tried: set[int] = set()
        limit = self.isolation.start_timeout_s + self.config.call_timeout_s
        while True:
            live = [i for i in range(len(self.actors)) if i not in self.lost | tried]
            if not live:
                raise SandboxStartError(
                    f"no Ray sandbox node can start a sandbox ({len(self.lost)} of "
                    f"{len(self.actors)} actors lost)"
                )
            index = min(live, key=lambda i: self.held[i])
            tried.add(index)
            self.held[index] += 1
            try:
                ref = self.actors[index].spawn.remote(mode, session_limits)
                answer = await asyncio.wait_for(raycluster.as_future(ref), limit)
            except TimeoutError:
                self.held[index] -= 1
                logger.error("Ray sandbox actor %d did not start a sandbox in %.0fs", index, limit)
                continue
            except Exception as exc:
                self.held[index] -= 1
                if not raycluster.is_actor_lost(exc):
                    raise
                self.mark_lost(index, exc)
                continue
            if isinstance(answer, str):
                self.held[index] -= 1
                raise SandboxStartError(f"on Ray node {self.node_ids[index][:12]}: {answer}")
            return RemoteSandbox(self, index, answer)

    async def stop(self) -> None:
        """Stop every actor (killing its sandboxes) and the Ray this service started."""
        await self._spread.stop(self.lost)
