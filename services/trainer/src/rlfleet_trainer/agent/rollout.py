"""The multi-turn rollout loop: one trajectory of a policy calling an episode's tools, and
a prompt's group of them.

One trajectory: OpenEpisode → repeat {Generate on the trajectory's ids so far (the model's
earlier tokens are its own ids, never re-tokenized); parse the tool calls; none → that was
the final answer; Step; append the environment tokens (agent.render)} → CloseEpisode,
whose reward is the trajectory's. The episode is always closed: scored on a normal end or
a limit, abandoned when a call fails or the task is cancelled.

Limits (`multi_turn`): `max_turns` model turns, `max_trajectory_tokens` in all, and
`max_trajectory_time_s` of wall time. Reaching one (or a turn cut by `max_new_tokens`)
ends the trajectory `truncated`, so `grpo.overlong_filtering` drops its loss as for an
overlong single-turn sample; the episode is still scored, so the group stays whole.

Weight updates between turns: each turn records the weight version its Generate started
under (`turn_weight_versions`); the trajectory's `weight_version` is the OLDEST of them, so
the async lag rule (`grpo.max_trajectory_age_steps`, rlfleet_trainer.replay) judges a
trajectory by its stalest turn, and importance correction uses each token's own sampler
logprob, whatever version produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from rlfleet_contracts.multiturn import MultiTurnConfig
from rlfleet_contracts.reasoning import row_template_kwargs
from rlfleet_contracts.recipe import RecipeConfig
from rlfleet_contracts.reward_client import RewardClient, RewardFailed
from rlfleet_core.tool_calls import ParsedCall
from rlfleet_proto.v1 import reward_pb2, rollout_pb2

from rlfleet_trainer.agent.calls import call_counts
from rlfleet_trainer.agent.episodes import EpisodeClient
from rlfleet_trainer.agent.render import ChatRenderer, openai_tools
from rlfleet_trainer.agent.tool_format import (
    ToolCallFormat,
    split_reasoning,
    tool_call_format,
)
from rlfleet_trainer.batch import Trajectory
from rlfleet_trainer.clients import GenerationFailed, RolloutClient, Sampling
from rlfleet_trainer.data import Prompt, row_messages

TURN_SEED_STRIDE = 1_000_003
"""Seeded sampling: turn t of sample k samples with seed + k + t·stride."""


@dataclass(frozen=True)
class AgentLimits:
    max_turns: int
    max_tokens: int
    """Prompt + model + environment tokens."""
    max_time_s: float

    @classmethod
    def from_config(cls, config: MultiTurnConfig, max_total_sequence_length: int) -> AgentLimits:
        return cls(
            max_turns=config.max_turns,
            max_tokens=config.max_trajectory_tokens or max_total_sequence_length,
            max_time_s=config.max_trajectory_time_s,
        )


@dataclass
class _Growing:
    """A trajectory under construction."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    truncated: bool = False
    last_text: str = ""
    model_tokens: int = 0
    malformed_calls: int = 0
    """Calls the trainer could not read (agent.calls): never sent to the gateway."""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    def add_model(self, result: rollout_pb2.GenerateResult) -> None:
        self.ids.extend(result.token_ids)
        self.mask.extend([1] * len(result.token_ids))
        self.logprobs.extend(result.logprobs)
        self.versions.append(int(result.weight_version_first))
        self.model_tokens += len(result.token_ids)

    def add_environment(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))


class AgentRollout:
    """Runs multi-turn trajectories for the rows of `envs`."""

    def __init__(
        self,
        rollout: RolloutClient,
        episodes: EpisodeClient,
        tokenizer: Any,
        fmt: ToolCallFormat,
        limits: AgentLimits,
        *,
        envs: set[str],
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.rollout = rollout
        self.episodes = episodes
        self.tokenizer = tokenizer
        self.format = fmt
        self.renderer = ChatRenderer(tokenizer, fmt, template_kwargs)
        self.limits = limits
        self.envs = envs

    def handles(self, env: str) -> bool:
        return env in self.envs

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    async def group(self, prompt: Prompt, size: int, sampling: Sampling) -> list[Trajectory]:
        """`size` trajectories of `prompt`, each with its own episode; one failure fails
        the group (the others are cancelled, and their episodes abandoned)."""
        try:
            async with asyncio.TaskGroup() as tasks:
                running = [
                    tasks.create_task(self.trajectory(prompt, k, sampling)) for k in range(size)
                ]
        except BaseExceptionGroup as failed:  # the collector handles one failure, not a group
            raise failed.exceptions[0] from None
        return [task.result() for task in running]

    async def trajectory(self, prompt: Prompt, sample_index: int, sampling: Sampling) -> Trajectory:
        started = time.monotonic()
        episode = await self._open(prompt, sample_index)
        scored = False
        try:
            growing = await self._prompt(prompt, episode)
            if growing.length >= self.limits.max_tokens:
                raise GenerationFailed(
                    f"{prompt.prompt_id}: the prompt with the episode's tools is "
                    f"{growing.length} tokens, no room under multi_turn.max_trajectory_tokens "
                    f"({self.limits.max_tokens}); raise it or shorten the tools",
                    transient=False,
                    failed_samples=1,
                )
            try:
                async with asyncio.timeout(self.limits.max_time_s - (time.monotonic() - started)):
                    await self._turns(prompt, sample_index, sampling, episode, growing, started)
            except TimeoutError:
                growing.truncated = True
            answer, reasoning = split_reasoning(growing.last_text)
            score = await self.episodes.close(
                episode.episode_id, answer, reasoning, growing.model_tokens
            )
            scored = True
        finally:
            if not scored:
                await self._abandon(episode.episode_id)
        return Trajectory(
            prompt_id=prompt.prompt_id,
            sample_index=sample_index,
            prompt_token_ids=growing.prompt_ids,
            token_ids=growing.ids,
            generation_logprobs=growing.logprobs,
            truncated=growing.truncated,
            reward=score.reward,
            reward_masked=score.masked,
            env=prompt.env,
            weight_version=min(growing.versions, default=0),
            loss_mask=growing.mask,
            turn_weight_versions=growing.versions,
            tool_calls=call_counts(score.info, growing.malformed_calls),
        )

    async def _open(self, prompt: Prompt, sample_index: int) -> reward_pb2.Episode:
        """OpenEpisode; cancelled while it runs (a sibling failed, the run stops), the call
        still completes (within its deadline) and the episode it opened is abandoned, so
        no episode is left open on the gateway."""
        opening = asyncio.ensure_future(
            self.episodes.open(f"{prompt.prompt_id}/{sample_index}", prompt.env, prompt.row_json)
        )
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._abandon((await opening).episode_id)
            raise

    async def _abandon(self, episode_id: str) -> None:
        """Abandon the episode, to the end even when cancelled meanwhile (the call has a
        deadline): a cancelled trajectory must not leave its episode open."""
        abandoning = asyncio.ensure_future(self.episodes.abandon(episode_id))
        try:
            await asyncio.shield(abandoning)
        except asyncio.CancelledError:
            await abandoning
            raise

    async def _prompt(self, prompt: Prompt, episode: reward_pb2.Episode) -> _Growing:
        row = json.loads(prompt.row_json)
        try:
            tools = openai_tools(episode.tools)
        except ValueError as exc:
            raise RewardFailed(
                f"OpenEpisode {prompt.prompt_id} ({prompt.env}): {exc}",
                transient=False,
                failed_samples=1,
            ) from None
        text = self.renderer.prompt_text(row_messages(row), tools, row_template_kwargs(row))
        return _Growing(prompt_ids=self.renderer.encode(text))

    async def _turns(
        self,
        prompt: Prompt,
        sample_index: int,
        sampling: Sampling,
        episode: reward_pb2.Episode,
        growing: _Growing,
        started: float,
    ) -> None:
        for turn in range(self.limits.max_turns):
            room = self.limits.max_tokens - growing.length
            if room < 1:
                growing.truncated = True
                return
            turn_sampling = sampling.capped(room)
            if sampling.seed is not None:
                seed = sampling.seed + sample_index + turn * TURN_SEED_STRIDE
                turn_sampling = dataclasses.replace(turn_sampling, seed=seed)
            [result] = await self.rollout.generate(
                f"{prompt.prompt_id}/{sample_index}/t{turn}",
                growing.prompt_ids + growing.ids,
                1,
                turn_sampling,
            )
            growing.add_model(result)
            growing.last_text = self.decode(list(result.token_ids))
            calls = self.format.parse(split_reasoning(growing.last_text)[0])
            growing.malformed_calls += sum(1 for call in calls if call.error)
            if result.finish_reason != rollout_pb2.FINISH_REASON_STOP:
                growing.truncated = True  # cut by a token limit: no complete call to run
                return
            if not calls:
                return  # the final answer
            if turn == self.limits.max_turns - 1:
                growing.truncated = True  # still calling tools after the last turn
                return
            remaining = self.limits.max_time_s - (time.monotonic() - started)
            results, done = await self._run_calls(episode.episode_id, turn, calls, remaining)
            if done:
                return
            stop = self.tokenizer.decode(list(result.token_ids[-1:]), skip_special_tokens=False)
            env_ids = self.renderer.encode(self.renderer.environment_text(results, stop))
            if growing.length + len(env_ids) >= self.limits.max_tokens:
                growing.truncated = True
                return
            growing.add_environment(env_ids)
        growing.truncated = True  # unreachable unless max_turns < 1

    async def _run_calls(
        self, episode_id: str, turn: int, calls: list[ParsedCall], remaining_s: float
    ) -> tuple[list[reward_pb2.ToolResult], bool]:
        """The results of one turn's calls, in order: malformed calls answered here with an
        error result, the rest by one Step; and whether the environment ended the episode."""
        results: list[reward_pb2.ToolResult | None] = []
        valid: list[reward_pb2.ToolCall] = []
        for k, call in enumerate(calls):
            call_id = f"call_{turn}_{k}"
            if call.error:
                results.append(
                    reward_pb2.ToolResult(
                        call_id=call_id, name=call.name, content=f"Error: {call.error}", error=True
                    )
                )
                continue
            results.append(None)
            valid.append(
                reward_pb2.ToolCall(
                    call_id=call_id, name=call.name, arguments_json=call.arguments_json
                )
            )
        done = False
        if valid:
            step = await self.episodes.step(episode_id, valid, remaining_s)
            answers = iter(step.results)
            results = [r if r is not None else next(answers) for r in results]
            done = step.done
        return [r for r in results if r is not None], done


def build_agent(
    recipe: RecipeConfig, rollout: RolloutClient, reward: RewardClient, tokenizer: Any
) -> AgentRollout | None:
    """The recipe's multi-turn runner (sharing the clients' channels); None when
    `multi_turn.envs` is empty."""
    config = recipe.multi_turn
    if not config.envs:
        return None
    if tokenizer is None:
        raise ValueError("multi_turn.envs is set but no tokenizer was given to render episodes")
    return AgentRollout(
        rollout,
        EpisodeClient(reward, config.step_timeout_s),
        tokenizer,
        tool_call_format(config.tool_call_format),
        AgentLimits.from_config(config, recipe.policy.max_total_sequence_length),
        envs=set(config.envs),
        template_kwargs=dict(recipe.reasoning.chat_template_kwargs),
    )
