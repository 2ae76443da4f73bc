"""The `execute_python` tool of `math_with_code`: stateful Python per episode, in the sandbox.

A policy in a multi-turn rollout calls the tool several times in one episode; variables
defined by one call are there in the next (NeMo-Gym's math_with_code keeps a process
per session the same way). An episode is (caller, episode name): the caller is who
calls the gateway (tool_routes.py: the hash of its client key or of the gateway-minted
cookie), the name its `X-Session-ID`. Another caller that sends the same name reaches a
different episode, never this one. Each episode maps to one sandbox session, opened on
its first call under a sandbox client key of its own (sandbox_client.py). A session ends
on `end_session`, or when it stays unused past `idle_timeout_s` (the sandbox closes it).

Answers have NeMo-Gym's ExecutePythonResponse shape: `success`, `stdout`, `stderr`,
`error_message`, `result`. A cell's trailing expression is echoed in `stdout` (the
sandbox's interactive mode), so `result` is always null. The program's own failures
(exception, timeout, memory) are answers with `success: false`, never errors: the policy
reads them. A sandbox that cannot run code raises `SandboxUnavailable` (HTTP 503),
session limits reached `SandboxBusy` (HTTP 429).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from rlfleet_contracts.sandbox_client import (
    ExecOutcome,
    ExecStatus,
    SandboxBusy,
    SandboxUnavailable,
    SessionGone,
)

EPISODE_KEY = re.compile(r"^[A-Za-z0-9_.:-]{0,128}$")
"""Accepted episode names (the sandbox's own session-id alphabet); "" is a caller's
default episode."""
Episode = tuple[str, str]
"""(caller, episode name): the key of one episode's session."""


class SessionSandbox(Protocol):
    async def execute(
        self, code: str, *, stdin: str = "", timeout_s: float, session_id: str = ""
    ) -> ExecOutcome: ...

    async def create_session(self, *, idle_timeout_s: float, timeout_s: float) -> str: ...

    async def close_session(self, session_id: str) -> bool: ...


@dataclass(frozen=True)
class ToolLimits:
    timeout_s: float = 10.0
    """Wall-clock limit of one call (NeMo-Gym's max_execution_time)."""
    idle_timeout_s: float = 600.0
    """An episode's session closes after this long unused."""
    max_episodes: int = 256
    """Episodes with an open session at once; one more is SandboxBusy (HTTP 429). An
    episode unused past `idle_timeout_s` no longer counts (its session has idled out)."""
    max_code_chars: int = 100_000
    """Longest program accepted in one call."""


def tool_answer(outcome: ExecOutcome, note: str = "") -> dict[str, Any]:
    """NeMo-Gym's ExecutePythonResponse for one run."""
    stderr = note + outcome.stderr
    error = None
    if outcome.status is ExecStatus.TIMEOUT:
        error = "the code timed out"
    elif outcome.status is ExecStatus.MEMORY:
        error = "the code ran out of memory"
    elif outcome.status is ExecStatus.OUTPUT_LIMIT:
        error = "the code printed more than the output limit; output truncated"
    elif outcome.status is not ExecStatus.OK:
        lines = [line for line in outcome.stderr.strip().splitlines() if line.strip()]
        error = lines[-1][:500] if lines else f"exit code {outcome.exit_code}"
    return {
        "success": error is None,
        "stdout": outcome.stdout,
        "stderr": stderr,
        "error_message": error,
        "result": None,
    }


class PythonToolSessions:
    """(caller, episode) -> sandbox session; every sandbox call has a deadline (the client's)."""

    def __init__(self, sandbox: SessionSandbox, limits: ToolLimits | None = None) -> None:
        self.sandbox = sandbox
        self.limits = limits or ToolLimits()
        # Least recently used first; the values' times are time.monotonic() of last use.
        self._sessions: OrderedDict[Episode, asyncio.Task[str]] = OrderedDict()
        self._last_used: dict[Episode, float] = {}

    @property
    def open_episodes(self) -> int:
        return len(self._sessions)

    def _forget_idle(self) -> None:
        """Drop episodes unused past the idle timeout: the sandbox has closed their sessions,
        and an agent that never called end_session must not hold a slot for ever."""
        deadline = time.monotonic() - self.limits.idle_timeout_s
        while self._sessions:
            key = next(iter(self._sessions))
            if self._last_used[key] > deadline:
                break
            del self._sessions[key], self._last_used[key]

    def _session(self, key: Episode) -> asyncio.Task[str]:
        self._forget_idle()
        task = self._sessions.get(key)
        if task is not None:
            self._sessions.move_to_end(key)
        else:
            if len(self._sessions) >= self.limits.max_episodes:
                raise SandboxBusy(
                    f"{len(self._sessions)} tool sessions are open (limit "
                    f"{self.limits.max_episodes}); end finished episodes with end_session"
                )
            # One task per key: concurrent first calls of an episode share one session.
            task = asyncio.ensure_future(
                self.sandbox.create_session(
                    idle_timeout_s=self.limits.idle_timeout_s, timeout_s=self.limits.timeout_s
                )
            )
            self._sessions[key] = task
        self._last_used[key] = time.monotonic()
        return task

    async def _session_id(self, key: Episode) -> str:
        task = self._session(key)
        try:
            return await asyncio.shield(task)
        except BaseException:
            if task.done() and self._sessions.get(key) is task:
                del self._sessions[key], self._last_used[key]
            raise

    async def execute(self, caller: str, episode: str, code: str) -> dict[str, Any]:
        """Run `code` in the session of `caller`'s `episode` (opened on first use)."""
        key = (caller, episode)
        session_id = await self._session_id(key)
        try:
            outcome = await self.sandbox.execute(
                code, timeout_s=self.limits.timeout_s, session_id=session_id
            )
            note = ""
        except SessionGone:
            # Expired (idle) or closed under us: start afresh and say so, as a notebook would.
            self._sessions.pop(key, None)
            self._last_used.pop(key, None)
            session_id = await self._session_id(key)
            outcome = await self.sandbox.execute(
                code, timeout_s=self.limits.timeout_s, session_id=session_id
            )
            note = "[tool] the previous session had expired; its variables are gone.\n"
        if key in self._last_used:  # idle time counts from the end of a call, as the sandbox's
            self._last_used[key] = time.monotonic()
        if outcome.status is ExecStatus.SANDBOX_ERROR:
            raise SandboxUnavailable(f"the sandbox could not run the code: {outcome.stderr[-300:]}")
        return tool_answer(outcome, note)

    async def end(self, caller: str, episode: str) -> bool:
        """Close the session of `caller`'s `episode`; whether it had one."""
        key = (caller, episode)
        task = self._sessions.pop(key, None)
        self._last_used.pop(key, None)
        if task is None:
            return False
        try:
            session_id = await task
        except SandboxUnavailable:
            return False
        await self.sandbox.close_session(session_id)
        return True
