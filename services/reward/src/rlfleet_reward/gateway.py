"""The reward gateway's engine: row validation, dispatch to environments, timeouts, metrics.

Both faces (gRPC servicer, NeMo-Gym HTTP routes) are thin translations over `Gateway`:
they build a row dict and `Sample`s, call `score` / `score_group`, and map the errors
raised here — `InvalidArgument` (bad request, naming the field) and `Overloaded` — to
their status codes. Anything that goes wrong *while* scoring comes back as a `Score`
with a failure kind and reason, never as an exception and never as a silent 0.

Each environment's `score` runs where its placement says (placement.py): inline on this
event loop, in a thread, or in the worker pool (on this host, or over a Ray cluster:
ray_pool.py).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet_contracts.sandbox_client import SandboxClient
from rlfleet_contracts.swe_client import SweRunnerClient
from rlfleet_core.errors import InvalidArgument

from rlfleet_reward import metrics
from rlfleet_reward.config import RewardServiceConfig
from rlfleet_reward.environments import ENVIRONMENT_NAMES, get_environment, register_environment
from rlfleet_reward.environments.base import Environment, Placement
from rlfleet_reward.environments.group import GroupEnvironment
from rlfleet_reward.judge.client import JudgeClient
from rlfleet_reward.judge.config import GenRMConfig
from rlfleet_reward.limits import JsonCheck, check_size, check_text, clip, loads
from rlfleet_reward.placement import InlineRunner, ThreadRunner, resolve
from rlfleet_reward.pool import VerifierPool
from rlfleet_reward.ray_pool import RayVerifierPool
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure

logger = logging.getLogger(__name__)

# Answer this much before the caller's deadline, so the failure reaches it in time.
_DEADLINE_MARGIN_S = 0.2
# The gateway's own backstop fires this long after an environment's budget: the pool (or
# the environment) is expected to answer first, with the more precise reason.
_BACKSTOP_S = 0.1


@dataclass(frozen=True)
class EnvironmentInfo:
    name: str
    description: str
    required_fields: tuple[str, ...]
    optional_fields: tuple[str, ...]
    group_aware: bool
    multi_turn: bool = False
    """An episode environment (OpenEpisode/Step/CloseEpisode), not one of Score's."""


class _Context:
    """RunContext for one call: the budget, the pool, the sandbox."""

    def __init__(self, gateway: Gateway, timeout_s: float) -> None:
        self.gateway = gateway
        self.timeout_s = timeout_s

    async def run_in_pool(self, env: str, spec: Any, sample: Sample) -> Score:
        return await self.gateway.pool.submit(env, spec, sample, self.timeout_s)

    async def verify(self, env: str, spec: Any, sample: Sample) -> Score:
        return await self.gateway.verify(env, spec, sample, self.timeout_s)

    async def run_env(self, env: str, spec: Any, sample: Sample) -> Score:
        if env not in self.gateway.enabled:
            return failure(
                FailureKind.INVALID_ROW, f"environment {env!r} is not enabled on this gateway"
            )
        return await get_environment(env).run(spec, sample, self)

    def sandbox(self) -> SandboxClient | None:
        return self.gateway.sandbox

    def judge(self) -> JudgeClient | None:
        return self.gateway.judge

    def genrm(self) -> GenRMConfig:
        return self.gateway.config.genrm


class Gateway:
    """Scores responses with the registered environments."""

    def __init__(self, config: RewardServiceConfig, sandbox: SandboxClient | None = None) -> None:
        self.config = config
        for name, path in config.extra_environments.items():
            register_environment(name, path)
        self.enabled = tuple(dict.fromkeys([*config.environments, *config.extra_environments]))
        envs = [get_environment(name) for name in self.enabled]
        preload = sorted({m for env in envs for m in (type(env).__module__, *env.preload_modules)})
        pool_args: dict[str, Any] = {
            "size": config.pool.workers,
            "max_queue": config.pool.max_queue,
            "kill_grace_s": config.pool.kill_grace_s,
            "env_names": list(self.enabled),
            "extra_environments": dict(config.extra_environments),
            "preload_modules": preload,
            "start_method": config.pool.start_method,
        }
        self.pool: VerifierPool | RayVerifierPool
        if config.pool.backend == "ray":
            self.pool = RayVerifierPool(
                config.ray, max_queue=config.pool.max_queue, pool_args=pool_args
            )
        else:
            self.pool = VerifierPool(**pool_args)
        if sandbox is None and config.sandbox.target:
            sandbox = SandboxClient(
                config.sandbox.target,
                call_overhead_s=config.sandbox.call_overhead_s,
                memory_bytes=config.sandbox.memory_bytes,
            )
        self.sandbox = sandbox
        self.swe_runner = (
            SweRunnerClient(config.swe.target, call_overhead_s=config.swe.call_overhead_s)
            if config.swe.target
            else None
        )
        self.judge = JudgeClient(config.judge) if config.judge.base_url else None
        self.placements: dict[str, Placement] = {
            name: resolve(name, get_environment(name).placement, config.placement)
            for name in self.enabled
        }
        self.inline = InlineRunner()
        if not self.inline.available and "loop" in self.placements.values():
            logger.warning("event loop is not on the main thread: loop placement runs in process")
        self.threads = ThreadRunner(config.pool.threads, config.pool.max_queue)
        # Inline time spent since the loop last polled for I/O (see `_inline`).
        self._inline_spent_s = 0.0
        self._inline_reset_due = False

    async def start(self) -> None:
        # Environments' own warm-up (reasoning-gym's task list) runs beside the pool's.
        warm = asyncio.gather(*(asyncio.to_thread(self._warm, n) for n in self.enabled))
        await asyncio.gather(self.pool.start(), warm)

    def _warm(self, name: str) -> None:
        env = get_environment(name)
        if self.placements[name] != "process":
            # Scored in this process: import what `score` needs now, not under the inline
            # guard, which may interrupt a first import midway (see Environment.warm).
            for module in env.preload_modules:
                importlib.import_module(module)
        env.warm()

    async def stop(self) -> None:
        self.threads.stop()
        await self.pool.stop()
        if self.sandbox is not None:
            await self.sandbox.close()
        if self.swe_runner is not None:
            await self.swe_runner.close()
        if self.judge is not None:
            await self.judge.close()

    def environments(self) -> list[EnvironmentInfo]:
        infos = []
        for name in self.enabled:
            env = get_environment(name)
            infos.append(
                EnvironmentInfo(
                    name, env.description, env.required_fields, env.optional_fields, env.group_aware
                )
            )
        return infos

    # --- validation ------------------------------------------------------------------

    def environment(self, name: str, field: str = "env") -> Environment:
        if not name:
            metrics.REJECTED.labels("invalid").inc()
            raise InvalidArgument(field, f"required; one of {', '.join(self.enabled)}")
        if name not in self.enabled:
            metrics.REJECTED.labels("invalid").inc()
            known = "not enabled here" if name in ENVIRONMENT_NAMES else "unknown"
            raise InvalidArgument(
                field, f"{known} environment {clip(name)!r}; one of {', '.join(self.enabled)}"
            )
        return get_environment(name)

    def parse_row_json(self, row_json: str, field: str = "row_json") -> dict[str, Any]:
        """The row of a gRPC request, checked against `limits` (InvalidArgument names the
        field: `row_json` for the text, `row.<key>` inside it)."""
        limits = self.config.limits
        try:
            check_size(len(row_json), limits.max_row_chars, field, "max_row_chars", "characters")
            row = loads(row_json, field, limits) if row_json.strip() else {}
            if not isinstance(row, dict):
                raise InvalidArgument(field, f"must be a JSON object, got {type(row).__name__}")
            JsonCheck(limits).check(row, "row")
        except InvalidArgument:
            metrics.REJECTED.labels("invalid").inc()
            raise
        return row

    def check_samples(self, samples: Sequence[Sample]) -> None:
        """Responses within `limits` (sizes; text the faces can echo)."""
        limits = self.config.limits
        check_size(len(samples), limits.max_group_size, "responses", "max_group_size", "responses")
        for i, sample in enumerate(samples):
            where = "response" if len(samples) == 1 else f"responses[{i}]"
            size = len(sample.text) + len(sample.reasoning_text)
            check_size(size, limits.max_response_chars, where, "max_response_chars", "characters")
            check_text(sample.text, f"{where}.text")
            check_text(sample.reasoning_text, f"{where}.reasoning_text")

    def prepare(
        self,
        env_name: str,
        row: Mapping[str, Any],
        samples: Sequence[Sample],
        row_field: str = "row",
    ) -> tuple[Environment, Any]:
        """The environment and its parsed spec; InvalidArgument names the bad field."""
        env = self.environment(env_name)
        try:
            self.check_samples(samples)
        except InvalidArgument:
            metrics.REJECTED.labels("invalid").inc(len(samples) or 1)
            raise
        try:
            spec = env.parse_row(row)
        except RowError as exc:
            metrics.REJECTED.labels("invalid").inc(len(samples) or 1)
            raise InvalidArgument(
                f"{row_field}.{clip(exc.field)}", clip(exc.problem, 1000)
            ) from None
        except (ValueError, TypeError, RecursionError, OverflowError) as exc:
            # An environment that missed a malformed row (a JSON string field nested too
            # deep for its own json.loads): still the request's fault, still before work.
            metrics.REJECTED.labels("invalid").inc(len(samples) or 1)
            raise InvalidArgument(
                row_field,
                f"{env_name} cannot parse this row ({type(exc).__name__}: {str(exc)[:200]})",
            ) from None
        if env.needs_num_tokens:
            for i, sample in enumerate(samples):
                if sample.num_tokens <= 0:
                    where = "response" if len(samples) == 1 else f"responses[{i}]"
                    raise InvalidArgument(
                        f"{where}.num_tokens", f"{env_name} needs the generated token count (> 0)"
                    )
        return env, spec

    def budget_s(self, env_name: str, deadline_s: float | None) -> float:
        budget = self.config.env_timeout_s.get(env_name, self.config.timeout_s)
        if deadline_s is not None:
            budget = min(budget, deadline_s - _DEADLINE_MARGIN_S)
        return budget

    # --- scoring -----------------------------------------------------------------------

    async def score(
        self, env_name: str, row: Mapping[str, Any], sample: Sample, deadline_s: float | None = None
    ) -> Score:
        """Score one response. `deadline_s`: seconds the caller will wait (None = no limit)."""
        env, spec = self.prepare(env_name, row, [sample])
        if isinstance(env, GroupEnvironment):
            raise InvalidArgument("env", f"{env_name} scores a group of responses: use ScoreGroup")
        return await self._run(env, spec, sample, self.budget_s(env_name, deadline_s))

    async def score_group(
        self,
        env_name: str,
        row: Mapping[str, Any],
        samples: Sequence[Sample],
        deadline_s: float | None = None,
    ) -> list[Score]:
        """Score a prompt's group of responses concurrently; results in the same order."""
        env, spec = self.prepare(env_name, row, samples)
        budget = self.budget_s(env_name, deadline_s)
        if isinstance(env, GroupEnvironment):
            if len(samples) < env.min_group_size:
                raise InvalidArgument(
                    "responses", f"{env_name} needs at least {env.min_group_size} responses"
                )
            return await self._run_group(env, spec, samples, budget)
        self.reserve(env_name, len(samples))
        return list(await asyncio.gather(*(self._run(env, spec, s, budget) for s in samples)))

    async def _run_group(
        self, env: GroupEnvironment, spec: Any, samples: Sequence[Sample], budget_s: float
    ) -> list[Score]:
        """A group environment's scores within `budget_s` (all TIMEOUT past it)."""
        start = time.perf_counter()
        results: list[Score] | None = None
        if budget_s > 0:
            try:
                async with asyncio.timeout(budget_s + _BACKSTOP_S):
                    results = await env.run_group(spec, samples, _Context(self, budget_s))
            except TimeoutError:
                pass
        if results is None:
            reason = f"{env.name} did not finish the group within {max(budget_s, 0):.2f}s"
            results = [failure(FailureKind.TIMEOUT, reason) for _ in samples]
        elapsed = time.perf_counter() - start
        for result in results:
            outcome = result.failure_kind.name.lower() if result.failed else "scored"
            metrics.RESULTS.labels(env.name, outcome).inc()
            metrics.VERIFY_SECONDS.labels(env.name, "gateway").observe(elapsed)
            if not result.failed:
                metrics.REWARD.labels(env.name).observe(result.reward)
            result.latency_s = elapsed
        return results

    def reserve(self, env_name: str, n: int) -> None:
        """Overloaded unless `n` more checks of `env_name` fit where it runs (a group is all
        or nothing). Inline checks need no room: they finish before the loop reads on."""
        where = self.placements.get(env_name, "process")
        if where == "thread":
            self.threads.reserve(n)
        elif where == "process" or not self.inline.usable():
            self.pool.reserve(n)

    async def verify(self, env_name: str, spec: Any, sample: Sample, budget_s: float) -> Score:
        """`score` of `env_name` where it is placed, within `budget_s`."""
        where = self.placements.get(env_name, "process")
        if where == "thread":
            return await self.threads.submit(env_name, spec, sample, budget_s)
        if where == "loop" and self.inline.usable():
            start = time.monotonic()
            result = await self._inline(env_name, spec, sample, budget_s)
            if result is not None:
                return result
            # Overran its guard: score again where it can be killed, with what is left.
            metrics.INLINE_OVERRUNS.labels(env_name).inc()
            budget_s -= time.monotonic() - start
            if budget_s <= 0:
                return failure(
                    FailureKind.TIMEOUT, f"{env_name} did not finish within its budget inline"
                )
        return await self.pool.submit(env_name, spec, sample, budget_s)

    async def _inline(
        self, env_name: str, spec: Any, sample: Sample, budget_s: float
    ) -> Score | None:
        """One guarded inline check (None: it overran). The checks of a large group (or of
        many calls) are all ready in the same loop iteration and would run back to back:
        once they have used `pool.inline_budget_s` in one iteration, the rest wait for the
        next, so the loop polls I/O (and answers /healthz) between bursts."""
        limit_s = self.config.pool.inline_budget_s
        deadline = time.monotonic() + budget_s
        while self._inline_spent_s >= limit_s:
            await asyncio.sleep(0)
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return None  # waited out its budget: the caller answers TIMEOUT
        if not self._inline_reset_due:
            # Runs at the start of the next iteration, after the I/O poll.
            asyncio.get_running_loop().call_soon(self._reset_inline)
            self._inline_reset_due = True
        start = time.monotonic()
        try:
            return self.inline.run(env_name, spec, sample, min(limit_s, left_s))
        finally:
            self._inline_spent_s += time.monotonic() - start

    def _reset_inline(self) -> None:
        self._inline_spent_s = 0.0
        self._inline_reset_due = False

    def placement_label(self, env: Environment) -> str:
        """Where `env` ran, for metrics: its placement, or `gateway` for one that overrides
        `run` (the code env's sandbox calls, wrappers)."""
        if type(env).run is not Environment.run:
            return "gateway"
        where = self.placements.get(env.name, "process")
        return where if where != "loop" or self.inline.usable() else "process"

    async def _run(self, env: Environment, spec: Any, sample: Sample, budget_s: float) -> Score:
        start = time.perf_counter()
        if budget_s <= 0:
            result = failure(FailureKind.TIMEOUT, "the call's deadline left no time to verify")
        else:
            try:
                # The pool enforces budgets on worker jobs; this bounds in-process ones
                # (the code env waiting on the sandbox) the same way.
                async with asyncio.timeout(budget_s + _BACKSTOP_S):
                    result = await env.run(spec, sample, _Context(self, budget_s))
            except TimeoutError:
                result = failure(
                    FailureKind.TIMEOUT, f"{env.name} did not finish within {budget_s:.2f}s"
                )
        elapsed = time.perf_counter() - start
        outcome = result.failure_kind.name.lower() if result.failed else "scored"
        metrics.RESULTS.labels(env.name, outcome).inc()
        metrics.VERIFY_SECONDS.labels(env.name, self.placement_label(env)).observe(elapsed)
        if not result.failed:
            metrics.REWARD.labels(env.name).observe(result.reward)
        result.latency_s = elapsed
        return result
