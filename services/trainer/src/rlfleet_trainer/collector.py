"""The trajectory collector: keeps prompt groups in flight on the rollout service and
moves finished, scored groups into the replay buffer.

Each prompt is one asyncio task: Generate (G samples, streamed) → decode → ScoreGroup →
replay buffer. A prompt of a multi-turn environment (`multi_turn.envs`) runs its G
trajectories through rlfleet_trainer.agent instead (episodes on the reward gateway, each
scored by CloseEpisode). A group that still fails after the clients' retries (any sample without a
reward: GRPO's baseline needs all G) becomes a ledger drop with a reason
(`generation_failed`, `reward_failed`), is replaced by a fresh prompt, and counts against
the step's `FailureBudget`.

Everything the checkpoint needs (`state()`) is plain data read synchronously, so no task
can change it half-way through a snapshot: the event loop runs one thing at a time.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.reward_client import RewardClient, RewardFailed
from rlfleet_proto.v1 import rollout_pb2

from rlfleet_trainer.agent.rollout import AgentRollout, build_agent
from rlfleet_trainer.batch import Trajectory
from rlfleet_trainer.clients import GenerationFailed, RolloutClient, Sampling
from rlfleet_trainer.data import Prompt, PromptSource
from rlfleet_trainer.ledger import LedgerEntry
from rlfleet_trainer.replay import PromptGroup, ReplayBuffer

logger = logging.getLogger(__name__)


class TooManyFailures(RuntimeError):
    pass


@dataclass
class CollectorStats:
    generated_tokens: int = 0
    generation_time_s: float = 0.0
    failures: int = 0
    groups_done: int = 0
    drops: dict[str, int] = field(default_factory=dict)


@dataclass
class FailureBudget:
    """How many groups may fail per step, and how many failing steps in a row
    (`grpo.max_failed_group_fraction`, `grpo.max_consecutive_failing_steps`).

    A step may lose ⌊f/(1−f) × P⌋ groups: then at most a share f of the groups finished
    while collecting it failed. One failure more makes a failing step; the count starts
    over and collection goes on, so an outage that outlives the retries costs a step or
    two, not the run. More than `max_consecutive_failing_steps` failing steps with no
    step collected within its budget in between stop the run."""

    max_failed_group_fraction: float
    max_consecutive_failing_steps: int
    num_prompts_per_step: int
    failed: int = 0
    """Failed groups counted against the current step's budget."""
    failing_steps: int = 0
    """The streak of failing steps."""
    overflowed: bool = False
    """The current step has used its budget up at least once."""

    @property
    def groups_per_step(self) -> int:
        f = self.max_failed_group_fraction
        return math.floor(f / (1 - f) * self.num_prompts_per_step + 1e-9)

    def count_failure(self, last: Exception) -> TooManyFailures | None:
        """One more failed group; the error that stops the run once the streak is over
        budget."""
        self.failed += 1
        if self.failed <= self.groups_per_step:
            return None
        self.failed = 0
        self.overflowed = True
        self.failing_steps += 1
        logger.warning(
            "failing step (%d in a row): more than %d failed prompt groups",
            self.failing_steps,
            self.groups_per_step,
        )
        if self.failing_steps <= self.max_consecutive_failing_steps:
            return None
        return TooManyFailures(
            f"{self.failing_steps} failing steps in a row > "
            f"grpo.max_consecutive_failing_steps ({self.max_consecutive_failing_steps}); "
            f"a step fails with more than {self.groups_per_step} failed prompt groups "
            f"(grpo.max_failed_group_fraction={self.max_failed_group_fraction} with "
            f"grpo.num_prompts_per_step={self.num_prompts_per_step}). Last failure: {last}. "
            "Check the rollout and reward services, or raise these settings."
        )

    def end_step(self) -> None:
        """The step's groups are collected: a step within budget ends the streak."""
        if not self.overflowed:
            self.failing_steps = 0
        self.failed = 0
        self.overflowed = False


@dataclass
class StepFailures:
    groups: int = 0
    samples: int = 0
    """Samples of the failed groups left without a result."""
    retries_before: int = 0
    """The clients' retry count when the step began."""


class Collector:
    @classmethod
    def from_recipe(
        cls,
        recipe: RecipeConfig,
        source: PromptSource,
        rollout: RolloutClient,
        reward: RewardClient,
        decode: Callable[[list[int]], str],
        tokenizer: Any = None,
    ) -> Collector:
        """`tokenizer` renders multi-turn trajectories; needed when `multi_turn.envs` is set."""
        g = recipe.grpo
        return cls(
            source,
            rollout,
            reward,
            decode,
            group_size=g.num_generations_per_prompt,
            sampling=Sampling.from_generation(recipe.generation),
            buffer_max_age=g.max_trajectory_age_steps,
            budget=FailureBudget(
                g.max_failed_group_fraction,
                g.max_consecutive_failing_steps,
                g.num_prompts_per_step,
            ),
            agent=build_agent(recipe, rollout, reward, tokenizer),
        )

    def __init__(
        self,
        source: PromptSource,
        rollout: RolloutClient,
        reward: RewardClient,
        decode: Callable[[list[int]], str],
        *,
        group_size: int,
        sampling: Sampling,
        buffer_max_age: int,
        budget: FailureBudget,
        agent: AgentRollout | None = None,
    ) -> None:
        self.source = source
        self.agent = agent
        """Runs the prompts of multi-turn environments; None = every prompt single-turn."""
        self.rollout = rollout
        self.reward = reward
        self.decode = decode
        self.group_size = group_size
        self.sampling = sampling
        self.buffer = ReplayBuffer(buffer_max_age)
        self.auto_fill_limit: int | None = None
        """Async: refill to this many groups whenever one finishes or is taken; sync: None
        (prompts start only when the loop asks, after the new weights are published)."""
        self._closing = False
        self.budget = budget
        self.step_failures = StepFailures()
        """Failures while collecting the current step (reported in its metrics)."""
        self.redo: deque[int] = deque()
        """Prompt indices to issue before new ones (in flight at the resumed checkpoint)."""
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self.drops: list[LedgerEntry] = []
        """Drops not yet written to the ledger (flushed at each step)."""
        self.stats = CollectorStats()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None

    # --- dispatch -------------------------------------------------------------------------

    def fill(self, limit: int) -> None:
        """Start prompts until in-flight + buffered groups reach `limit`."""
        skipped = 0
        while len(self.in_flight) + len(self.buffer) < limit:
            prompt = self.source.prompt_at(self.redo.popleft()) if self.redo else self.source.next()
            if self.source.too_long(prompt):
                self.drop(prompt.prompt_id, "prompt_too_long")
                skipped += 1
                if skipped > len(self.source.rows):  # a whole epoch: no row fits
                    self._error = ValueError(
                        f"every prompt is longer than {self.source.max_prompt_tokens} tokens; "
                        "raise policy.max_total_sequence_length or data.max_prompt_tokens"
                    )
                    self._changed.set()
                    return
                continue
            self.in_flight[prompt.index] = asyncio.create_task(self._collect(prompt))

    async def _collect(self, prompt: Prompt) -> None:
        try:
            group = await self._generate_and_score(prompt)
            self.buffer.add(group)
            self.stats.groups_done += 1
        except (GenerationFailed, RewardFailed) as exc:
            reason = "generation_failed" if isinstance(exc, GenerationFailed) else "reward_failed"
            logger.warning("dropping %s: %s", prompt.prompt_id, exc)
            self.drop(prompt.prompt_id, reason)
            self.stats.failures += 1
            self.step_failures.groups += 1
            self.step_failures.samples += exc.failed_samples
            error = self.budget.count_failure(exc)
            if error is not None and self._error is None:
                self._error = error
        except BaseException as exc:  # surfaced to the loop, not swallowed
            if not isinstance(exc, asyncio.CancelledError):
                self._error = exc
            raise
        finally:
            self.in_flight.pop(prompt.index, None)
            self._changed.set()
            if self.auto_fill_limit is not None and not self._closing and self._error is None:
                self.fill(self.auto_fill_limit)

    async def _generate_and_score(self, prompt: Prompt) -> PromptGroup:
        if self.agent is not None and self.agent.handles(prompt.env):
            samples = await self.agent.group(prompt, self.group_size, self._sampling_for(prompt))
            self.stats.generated_tokens += sum(sum(s.loss_mask or []) for s in samples)
            return PromptGroup(prompt_id=prompt.prompt_id, env=prompt.env, samples=samples)
        results = await self.rollout.generate(
            prompt.prompt_id,
            prompt.token_ids,
            self.group_size,
            self._sampling_for(prompt),
        )
        samples = [trajectory_from_result(prompt, r) for r in results]
        self.stats.generated_tokens += sum(len(s.token_ids) for s in samples)
        self.stats.generation_time_s += sum(r.generation_time_s for r in results)
        texts = [self.decode(s.token_ids) for s in samples]
        scores = await self.reward.score_group(
            prompt.prompt_id,
            prompt.env,
            prompt.row_json,
            texts,
            [len(s.token_ids) for s in samples],
        )
        for sample, score in zip(samples, scores, strict=True):
            sample.reward = score.reward
            sample.reward_masked = score.masked
        return PromptGroup(prompt_id=prompt.prompt_id, env=prompt.env, samples=samples)

    def _sampling_for(self, prompt: Prompt) -> Sampling:
        """The recipe's sampling for `prompt`; seeded per prompt when `generation.seed` is
        set (the engine gives sample k of the group seed + k)."""
        return self.sampling.for_group(prompt.index, self.group_size, prompt.max_tokens)

    def drop(self, prompt_id: str, reason: str) -> None:
        self.drops.append(LedgerEntry(prompt_id=prompt_id, outcome="dropped", reason=reason))
        self.stats.drops[reason] = self.stats.drops.get(reason, 0) + 1

    # --- consumption ----------------------------------------------------------------------

    async def wait_for_groups(self, count: int, current_version: int, limit: int) -> None:
        """Until the buffer holds `count` fresh groups: evict stale ones (dropped with
        reason `stale`), keep `limit` groups in flight, wait for the next to finish."""
        while True:
            if self._error is not None:
                raise self._error
            for group in self.buffer.evict_stale(current_version):
                self.drop(group.prompt_id, "stale")
            if len(self.buffer) >= count:
                return
            self._changed.clear()
            self.fill(max(limit, count))
            if self._error is not None:
                raise self._error
            await self._changed.wait()

    def end_step(self) -> dict[str, float]:
        """Close the step's window: its `failures/*` metrics, and the judge's `genrm/*`
        (judge_stats) when groups were judged."""
        self.budget.end_step()
        retries = self.rollout.retries + self.reward.retries
        metrics = {
            "failures/groups": float(self.step_failures.groups),
            "failures/samples": float(self.step_failures.samples),
            "failures/retries": float(retries - self.step_failures.retries_before),
            "failures/failing_steps": float(self.budget.failing_steps),
            **self.reward.judge.take(),
        }
        self.step_failures = StepFailures(retries_before=retries)
        return metrics

    def take(self, count: int) -> list[PromptGroup]:
        taken = self.buffer.take(count)
        if self.auto_fill_limit is not None:
            self.fill(self.auto_fill_limit)
        return taken

    # --- checkpoint and shutdown ----------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Prompts issued but not in the buffer: re-issued first on resume."""
        return {"redo": sorted([*self.redo, *self.in_flight])}

    def restore(self, state: dict[str, Any]) -> None:
        self.redo = deque(state.get("redo", []))

    async def shutdown(self, step: int) -> None:
        """Cancel what is in flight; it and everything buffered is dropped `run_ended`."""
        self._closing = True
        unfinished = sorted([*self.redo, *self.in_flight])
        await self.cancel()
        for index in unfinished:
            self.drop(self.source.prompt_at(index).prompt_id, "run_ended")
        self.redo.clear()
        self.in_flight.clear()
        for group in self.buffer.take(len(self.buffer)):
            self.drop(group.prompt_id, "run_ended")

    async def cancel(self) -> None:
        """Stop every task in flight (their prompts stay listed by `state()` until then)."""
        self._closing = True
        await _cancel_all(list(self.in_flight.values()))


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def trajectory_from_result(prompt: Prompt, result: rollout_pb2.GenerateResult) -> Trajectory:
    return Trajectory(
        prompt_id=prompt.prompt_id,
        sample_index=int(result.sample_index),
        prompt_token_ids=list(prompt.token_ids),
        token_ids=list(result.token_ids),
        generation_logprobs=list(result.logprobs),
        truncated=result.finish_reason == rollout_pb2.FINISH_REASON_LENGTH,
        env=prompt.env,
        weight_version=int(result.weight_version_first),
    )
