"""Open episodes of multi-turn environments: ownership, bounds, and the tool-call path.

Every bound is in config `episodes.*`. An episode belongs to the owner of the client key
that opened it (rlfleet_core.auth.owner_of, as sandbox sessions do); another owner's
episode answers NOT_FOUND, like one that never existed. A call the policy got wrong
(unknown tool, arguments that are not JSON, that do not match the tool's schema, that
are too long) or a tool that failed comes back as a result with error=true: the policy
reads it on its next turn, and the episode goes on. The episode counts its calls by kind
(`CALL_KINDS`) and its score's info carries the counts as `calls/<kind>` (the trainer's
hallucination rate reads them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from rlfleet_contracts.sandbox_client import SandboxBusy, SandboxUnavailable
from rlfleet_core.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable

from rlfleet_reward import metrics
from rlfleet_reward.config import EpisodesConfig
from rlfleet_reward.episodes import get_episode_environment
from rlfleet_reward.episodes.base import EpisodeEnvironment, Tool, ToolError
from rlfleet_reward.episodes.tools import row_tools
from rlfleet_reward.gateway import EnvironmentInfo, Gateway
from rlfleet_reward.limits import clip, loads
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure

logger = logging.getLogger(__name__)

CALL_KINDS = ("ok", "unknown_tool", "invalid_arguments", "tool_error", "after_end")
"""How a call ended: ran; named a tool the episode does not show; arguments that are not
a JSON object, too long, or outside the tool's schema (refused before the tool runs); the
tool refused it (ToolError: no such account, insufficient funds, ...), timed out or
failed; made after the environment ended the episode."""

_FORGET_CLOSED = 4096
"""Closed episodes remembered, so that their owner learns why an id is gone."""


@dataclass(frozen=True)
class Call:
    call_id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class CallResult:
    call_id: str
    name: str
    content: str
    error: bool = False


@dataclass
class _Episode:
    episode_id: str
    owner: str
    env: EpisodeEnvironment
    spec: Any
    state: Any
    tools: tuple[Tool, ...]
    """What the policy was shown (the row's tools, or the environment's)."""
    validators: dict[str, Draft202012Validator]
    """The callable tools: the shown ones, checked against the environment's own schemas."""
    last_used: float = field(default_factory=time.monotonic)
    done: bool = False
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CALL_KINDS, 0))
    """Calls so far by kind (CALL_KINDS)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class _Context:
    """EpisodeContext: the episode bounds, the gateway's sandbox and verifiers."""

    def __init__(self, config: EpisodesConfig, gateway: Gateway) -> None:
        self.tool_timeout_s = config.tool_timeout_s
        self.max_output_chars = config.max_output_chars
        self.max_state_bytes = config.max_state_bytes
        self.close_timeout_s = config.close_timeout_s
        self.idle_timeout_s = config.idle_timeout_s
        self._gateway = gateway

    def sandbox(self) -> Any:
        return self._gateway.sandbox

    def swe_runner(self) -> Any:
        return self._gateway.swe_runner

    @property
    def swe(self) -> Any:
        return self._gateway.config.swe

    async def verify(self, env: str, spec: Any, sample: Sample, budget_s: float) -> Score:
        if env not in self._gateway.enabled:
            return failure(FailureKind.VERIFIER_ERROR, f"environment {env!r} is not enabled here")
        return await self._gateway.verify(env, spec, sample, budget_s)


def cap(text: str, limit: int) -> str:
    """At most `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    note = f"\n[output truncated: {len(text) - limit} more characters]"
    return text[: max(0, limit - len(note))] + note


class EpisodeManager:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.config = gateway.config.episodes
        self.ctx = _Context(self.config, gateway)
        self._episodes: dict[str, _Episode] = {}
        self._opening = 0
        self._closed: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None

    @property
    def open_count(self) -> int:
        return len(self._episodes)

    async def start(self) -> None:
        self._reaper = asyncio.create_task(self._reap_idle())

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for episode_id in list(self._episodes):
            episode = self._episodes.pop(episode_id)
            await self._release(episode, "service stopped")

    def environments(self) -> list[EnvironmentInfo]:
        """The multi-turn environments served here (`episodes.environments`)."""
        infos = []
        for name in self.config.environments:
            env = get_episode_environment(name)
            infos.append(
                EnvironmentInfo(
                    name,
                    env.description,
                    env.required_fields,
                    env.optional_fields,
                    group_aware=False,
                    multi_turn=True,
                )
            )
        return infos

    # --- the three calls ---------------------------------------------------------------

    def environment(self, name: str) -> EpisodeEnvironment:
        if name not in self.config.environments:
            known = ", ".join(self.config.environments) or "(none enabled)"
            raise InvalidArgument(
                "env", f"unknown multi-turn environment {clip(name)!r}; known: {known}"
            )
        return get_episode_environment(name)

    async def open(
        self, owner: str, env_name: str, row: Mapping[str, Any]
    ) -> tuple[str, tuple[Tool, ...]]:
        env = self.environment(env_name)
        try:
            spec = env.parse_row(row)
            shown = row_tools(row, env.tools)
        except RowError as exc:
            raise InvalidArgument(f"row.{clip(exc.field)}", clip(exc.problem, 1000)) from None
        if len(self._episodes) + self._opening >= self.config.max_open:
            raise ResourceExhausted(
                f"{len(self._episodes)} episodes are open (episodes.max_open="
                f"{self.config.max_open}); close finished ones"
            )
        own = {tool.name: tool for tool in env.tools}
        validators = {t.name: Draft202012Validator(dict(own[t.name].parameters)) for t in shown}
        self._opening += 1  # holds the slot while a sandbox session starts
        try:
            async with asyncio.timeout(self.config.tool_timeout_s):
                state = await env.open(spec, self.ctx)
        except RowError as exc:
            raise InvalidArgument(f"row.{clip(exc.field)}", clip(exc.problem, 1000)) from None
        except SandboxBusy as exc:
            raise ResourceExhausted(f"the sandbox is busy: {exc}") from None
        except (SandboxUnavailable, TimeoutError) as exc:
            raise Unavailable(
                f"{env_name} could not start its episode: {exc or 'timed out'}"
            ) from None
        finally:
            self._opening -= 1
        episode_id = "ep-" + secrets.token_urlsafe(18)
        self._episodes[episode_id] = _Episode(
            episode_id, owner, env, spec, state, shown, validators
        )
        metrics.EPISODES_OPEN.set(len(self._episodes))
        return episode_id, shown

    async def step(
        self, owner: str, episode_id: str, calls: Sequence[Call]
    ) -> tuple[list[CallResult], bool]:
        episode = self._find(owner, episode_id)
        if len(calls) > self.config.max_calls_per_step:
            raise InvalidArgument(
                "calls",
                f"{len(calls)} calls in one step; at most {self.config.max_calls_per_step} "
                "(episodes.max_calls_per_step)",
            )
        async with episode.lock:
            if self._episodes.get(episode_id) is not episode:  # closed while we waited
                raise self._gone(owner, episode_id)
            results = [await self._one(episode, call) for call in calls]
            episode.last_used = time.monotonic()
        return results, episode.done

    async def close(
        self, owner: str, episode_id: str, sample: Sample | None, deadline_s: float | None
    ) -> Score | None:
        """The end state's score; None when `sample` is None (abandoned: freed, not scored)."""
        episode = self._find(owner, episode_id)
        del self._episodes[episode_id]
        metrics.EPISODES_OPEN.set(len(self._episodes))
        async with episode.lock:  # a Step in flight finishes first
            try:
                if sample is None:
                    return None
                score = await self._score(episode, sample, deadline_s)
                score.info.update({f"calls/{k}": str(n) for k, n in episode.calls.items()})
                return score
            finally:
                await self._release(episode, "abandoned" if sample is None else "scored")

    def env_of(self, owner: str, episode_id: str) -> str:
        """The environment of one of `owner`'s episodes (NotFound otherwise)."""
        return self._find(owner, episode_id).env.name

    # --- internals -----------------------------------------------------------------------

    def _find(self, owner: str, episode_id: str) -> _Episode:
        if not episode_id:
            raise InvalidArgument("episode_id", "required (from OpenEpisode)")
        episode = self._episodes.get(episode_id)
        if episode is None or episode.owner != owner:
            raise self._gone(owner, episode_id)
        return episode

    def _gone(self, owner: str, episode_id: str) -> NotFound:
        reason = self._closed.get((owner, episode_id))
        if reason is not None:
            return NotFound(f"episode {clip(episode_id)!r} is closed ({reason})")
        return NotFound(f"no episode {clip(episode_id)!r} of this caller (unknown or closed)")

    async def _one(self, episode: _Episode, call: Call) -> CallResult:
        content, kind = await self._run_call(episode, call)
        episode.calls[kind] += 1
        error = kind != "ok"
        metrics.TOOL_CALLS.labels(episode.env.name, "error" if error else "ok").inc()
        return CallResult(
            call.call_id, call.name, cap(content, self.config.max_output_chars), error
        )

    async def _run_call(self, episode: _Episode, call: Call) -> tuple[str, str]:
        if episode.done:
            return "the episode has ended; no more tool calls are accepted", "after_end"
        validator = episode.validators.get(call.name)
        if validator is None:
            names = ", ".join(t.name for t in episode.tools)
            return f"unknown tool {clip(call.name)!r}; the tools are: {names}", "unknown_tool"
        limit = self.config.max_arguments_chars
        if len(call.arguments_json) > limit:
            return (
                f"arguments of {len(call.arguments_json)} characters are too long "
                f"(at most {limit}); call {call.name} again with shorter arguments",
                "invalid_arguments",
            )
        try:
            text = call.arguments_json if call.arguments_json.strip() else "{}"
            arguments = loads(text, "arguments", self.gateway.config.limits)
        except InvalidArgument as exc:
            return f"arguments are not valid JSON: {clip(exc.message, 300)}", "invalid_arguments"
        if not isinstance(arguments, dict):
            return (
                f"arguments must be a JSON object, got {type(arguments).__name__}",
                "invalid_arguments",
            )
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            said = "; ".join(
                f"{'.'.join(map(str, p.path)) or 'arguments'}: {clip(p.message, 200)}"
                for p in problems[:3]
            )
            return f"invalid arguments for {call.name}: {said}", "invalid_arguments"
        try:
            async with asyncio.timeout(self.config.tool_timeout_s):
                outcome = await episode.env.call(episode.state, call.name, arguments, self.ctx)
        except ToolError as exc:
            return str(exc), "tool_error"
        except TimeoutError:
            return (
                f"{call.name} did not finish within {self.config.tool_timeout_s:g}s",
                "tool_error",
            )
        except SandboxUnavailable as exc:
            return f"the sandbox could not run {call.name}: {clip(str(exc), 300)}", "tool_error"
        except Exception:
            logger.exception("tool %s of %s failed", call.name, episode.env.name)
            return f"{call.name} failed inside the environment", "tool_error"
        episode.done = episode.done or outcome.done
        return outcome.content, "ok"

    async def _score(self, episode: _Episode, sample: Sample, deadline_s: float | None) -> Score:
        budget = self.config.close_timeout_s
        if deadline_s is not None:
            budget = min(budget, deadline_s - 0.2)
        if budget <= 0:
            return failure(FailureKind.TIMEOUT, "the call's deadline left no time to verify")
        start = time.perf_counter()
        try:
            async with asyncio.timeout(budget):
                score = await episode.env.score(episode.spec, episode.state, sample, self.ctx)
        except TimeoutError:
            score = failure(
                FailureKind.TIMEOUT, f"verification did not finish within {budget:.2f}s"
            )
        except SandboxUnavailable as exc:
            score = failure(FailureKind.SANDBOX_ERROR, clip(str(exc), 500))
        except Exception as exc:
            logger.exception("verifier of %s failed", episode.env.name)
            score = failure(
                FailureKind.VERIFIER_ERROR, f"{type(exc).__name__}: {clip(str(exc), 300)}"
            )
        score.latency_s = time.perf_counter() - start
        return score

    async def _release(self, episode: _Episode, how: str) -> None:
        self._closed[(episode.owner, episode.episode_id)] = how
        while len(self._closed) > _FORGET_CLOSED:
            self._closed.popitem(last=False)
        metrics.EPISODES_CLOSED.labels(episode.env.name, how.split()[0]).inc()
        try:
            async with asyncio.timeout(self.config.tool_timeout_s):
                await asyncio.shield(episode.env.release(episode.state, self.ctx))
        except Exception as exc:  # the sandbox's own idle timeout frees what is left
            logger.warning("releasing episode of %s failed: %s", episode.env.name, exc)

    async def _reap_idle(self) -> None:
        period = min(5.0, self.config.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            horizon = time.monotonic() - self.config.idle_timeout_s
            for episode_id, episode in list(self._episodes.items()):
                if episode.last_used < horizon and not episode.lock.locked():
                    del self._episodes[episode_id]
                    await self._release(episode, f"idle for over {self.config.idle_timeout_s:g}s")
            metrics.EPISODES_OPEN.set(len(self._episodes))
