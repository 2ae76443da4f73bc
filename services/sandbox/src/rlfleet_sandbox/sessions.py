"""Stateful Python sessions: one dedicated sandbox per session whose runner keeps a
namespace between cells (runner.serve_session). Calls on one session run one at a time.
A session closes when its client closes it or when it stays unused past its idle
timeout; at most `max_sessions` are open, `max_sessions_per_client` per client.

Sessions are owned: a client identifies itself with a secret key (`x-rlfleet-client-key`
header or gRPC metadata); its owner is a hash of that key, and sessions are looked up by
(owner, session id). Another client's session is NOT_FOUND, as if it did not exist, and
two clients that pick the same id (NeMo-Skills clients name sessions) get two sessions.
Keyless callers (an unmodified NeMo-Skills client) share the ANONYMOUS owner, a
namespace no key maps to: there the id itself is the capability, so keyless sessions
are never listed, and together they are capped by `max_keyless_sessions`.

A cell that overruns its time gets CellTimeout raised inside it (state kept); one that
ignores that, or crashes the interpreter, gets its sandbox killed, and the next call
starts a fresh interpreter (counted in rlfleet_sandbox_session_resets, and said in the
call's stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass, field

# Re-exported: the sandbox's faces and tests import them from here.
from rlfleet_core.auth import ANONYMOUS as ANONYMOUS
from rlfleet_core.auth import CLIENT_KEY_HEADER as CLIENT_KEY_HEADER
from rlfleet_core.auth import owner_of as owner_of
from rlfleet_core.errors import InvalidArgument, NotFound, ResourceExhausted

from rlfleet_sandbox.config import SessionsConfig
from rlfleet_sandbox.metrics import SESSION_RESETS, SESSIONS_CLOSED, SESSIONS_OPEN, SPAWNS
from rlfleet_sandbox.sandbox import RawRun, SandboxHandle, SandboxStartError, Spawner
from rlfleet_sandbox.types import ExecRequest, RunLimits

logger = logging.getLogger(__name__)

_SESSION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
RESET_NOTE = (
    b"\n[sandbox] the session's interpreter was stopped (it overran its limits or "
    b"crashed); its state is lost and the next call starts afresh.\n"
)


@dataclass
class Session:
    owner: str
    """Hash of the creating client's key (or ANONYMOUS); never the key itself."""
    session_id: str
    limits: RunLimits
    """Limits of the session's sandbox (memory, processes, ...); per-call time limits come
    with each call."""
    idle_timeout_s: float
    sandbox: SandboxHandle | None = None
    last_used: float = field(default_factory=time.monotonic)
    created: float = field(default_factory=time.time)
    calls: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def check_session_id(session_id: str, where: str = "session_id") -> str:
    if not _SESSION_ID.match(session_id):
        raise InvalidArgument(where, f"use 1-128 of A-Z a-z 0-9 _ . : -, got {session_id[:140]!r}")
    return session_id


class SessionManager:
    def __init__(self, spawn: Spawner, config: SessionsConfig) -> None:
        self._spawn_one = spawn
        self._config = config
        self._sessions: dict[tuple[str, str], Session] = {}
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle())

    def resolve_idle_timeout(self, requested_s: float) -> float:
        if not math.isfinite(requested_s) or requested_s < 0:
            raise InvalidArgument(
                "idle_timeout_s", f"must be >= 0 (0 = default), got {requested_s}"
            )
        if requested_s == 0:
            return self._config.idle_timeout_s
        return min(requested_s, self._config.max_idle_timeout_s)

    async def create(
        self, owner: str, limits: RunLimits, idle_timeout_s: float, session_id: str | None = None
    ) -> Session:
        """Open a session of `owner` (its sandbox starts now, so the first call is warm).
        Generated ids are 128 random bits."""
        if session_id is None:
            session_id = secrets.token_hex(16)
        elif (owner, session_id) in self._sessions:
            return self._sessions[(owner, session_id)]
        idle_timeout_s = self.resolve_idle_timeout(idle_timeout_s)
        mine = sum(1 for key in self._sessions if key[0] == owner)
        if owner == ANONYMOUS and mine >= self._config.max_keyless_sessions:
            raise ResourceExhausted(
                f"{mine} keyless sessions are open (sessions.max_keyless_sessions); close one "
                "(DELETE /sessions/{id}), wait for idle ones to expire, or send an "
                f"{CLIENT_KEY_HEADER} of your own"
            )
        if owner != ANONYMOUS and mine >= self._config.max_sessions_per_client:
            raise ResourceExhausted(
                f"this client has {mine} sessions open (sessions.max_sessions_per_client); "
                "close one (DELETE /sessions/{id} or CloseSession) or wait for idle ones to expire"
            )
        if len(self._sessions) >= self._config.max_sessions:
            raise ResourceExhausted(
                f"{len(self._sessions)} sessions are open (sessions.max_sessions); close one "
                "(DELETE /sessions/{id} or CloseSession) or wait for idle ones to expire"
            )
        session = Session(owner, session_id, limits, idle_timeout_s)
        key = (owner, session_id)
        self._sessions[key] = session
        SESSIONS_OPEN.set(len(self._sessions))
        try:
            async with session.lock:
                session.sandbox = await self._spawn(limits)
        except BaseException:
            self._sessions.pop(key, None)
            SESSIONS_OPEN.set(len(self._sessions))
            raise
        return session

    async def _spawn(self, limits: RunLimits) -> SandboxHandle:
        try:
            sandbox = await self._spawn_one("session", limits.for_runner())
        except SandboxStartError:
            SPAWNS.labels("session", "error").inc()
            raise
        SPAWNS.labels("session", "ok").inc()
        return sandbox

    def get(self, owner: str, session_id: str) -> Session:
        """`owner`'s session; another owner's is NOT_FOUND, worded as for a missing one so
        that nobody learns which ids exist."""
        session = self._sessions.get((owner, session_id))
        if session is None:
            raise NotFound(
                f"session {session_id!r} does not exist (closed, expired or never created)"
            )
        return session

    def exists(self, owner: str, session_id: str) -> bool:
        return (owner, session_id) in self._sessions

    @property
    def open_count(self) -> int:
        return len(self._sessions)

    async def run(
        self, owner: str, session_id: str, request: ExecRequest, kill_grace_s: float
    ) -> tuple[RawRun, bool]:
        """Run one cell; returns the raw run and whether the session's state was lost."""
        session = self.get(owner, session_id)
        async with session.lock:
            if self._sessions.get((owner, session_id)) is not session:  # closed meanwhile
                raise NotFound(f"session {session_id!r} was closed")
            session.calls += 1
            # Died since the last call (its node was lost, the OOM killer): its state is
            # gone, which this call reports, and the cell runs on a fresh interpreter.
            died_idle = session.sandbox is not None and not session.sandbox.alive
            if session.sandbox is None or not session.sandbox.alive:
                if session.sandbox is not None:
                    await session.sandbox.kill()
                session.sandbox = await self._spawn(session.limits)
            try:
                raw = await session.sandbox.run(request, kill_grace_s)
            finally:
                session.last_used = time.monotonic()
            lost = not session.sandbox.alive
            if died_idle and not lost:
                SESSION_RESETS.inc()
            if lost:
                SESSION_RESETS.inc()
                await session.sandbox.kill()
                session.sandbox = None
            return raw, lost or died_idle

    async def close(self, owner: str, session_id: str, reason: str = "client") -> bool:
        session = self._sessions.pop((owner, session_id), None)
        SESSIONS_OPEN.set(len(self._sessions))
        if session is None:
            return False
        SESSIONS_CLOSED.labels(reason).inc()
        # Kill first: a cell that is running holds the lock and would otherwise finish.
        if session.sandbox is not None:
            await session.sandbox.kill()
        return True

    def list(self, owner: str) -> list[Session]:
        """`owner`'s sessions; none for ANONYMOUS, whose ids are their only protection."""
        if owner == ANONYMOUS:
            return []
        return [s for s in self._sessions.values() if s.owner == owner]

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(self._config.reap_interval_s)
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if not session.lock.locked() and now - session.last_used > session.idle_timeout_s:
                    logger.info("closing idle session", extra={"session_id": session.session_id})
                    await self.close(session.owner, session.session_id, reason="idle")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for owner, session_id in list(self._sessions):
            await self.close(owner, session_id, reason="shutdown")
