"""The trainer's side of the rollout and reward protos: generate a prompt's group, score
it, publish weights. Every call has a deadline (rlfleet_core.client.connect) and a
failure is an exception naming the prompt and the status, never a silent default.

Generate and ScoreGroup are retried on transient failures (`CallRetry`, from
`services.call_attempts` / `services.retry_backoff_s`): the status codes in
`TRANSIENT_CODES`, an aborted or missing sample, and reward failures of the kinds in
`TRANSIENT_REWARD_FAILURES`. The channel's own gRPC retry (UNAVAILABLE before the first
response) still runs inside each try.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import torch
from grpc import aio
from rlfleet_contracts.recipe import GenerationConfig
from rlfleet_core.client import connect
from rlfleet_proto.v1 import (
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet_weights.base import WeightPublish, WeightSender
from rlfleet_weights.factory import make_sender

from rlfleet_trainer.judge_stats import JudgeTally, judge_calls_of

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Its own generator: retries must not move the seeded global RNG that checkpoints restore.
_JITTER = random.Random()


TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""Call statuses worth another try: the peer was down, slow or shedding load."""

TRANSIENT_REWARD_FAILURES = frozenset(
    {
        reward_pb2.FAILURE_KIND_TIMEOUT,
        reward_pb2.FAILURE_KIND_SANDBOX_ERROR,
        reward_pb2.FAILURE_KIND_JUDGE_ERROR,
        reward_pb2.FAILURE_KIND_OVERLOADED,
    }
)
"""Reward failures another try may not repeat; INVALID_ROW and VERIFIER_ERROR would."""


class CallFailed(RuntimeError):
    """A call failed after its retries; `transient` says whether another try could help."""

    def __init__(self, message: str, *, transient: bool, failed_samples: int) -> None:
        super().__init__(message)
        self.transient = transient
        self.failed_samples = failed_samples
        """Samples of the group left without a result (all of them for a failed call)."""


class GenerationFailed(CallFailed):
    pass


class RewardFailed(CallFailed):
    pass


class SamplesFailed(RewardFailed):
    """The call answered, but some samples came back as failures."""


@dataclass(frozen=True)
class CallRetry:
    attempts: int = 3
    """Tries per call, the first included."""
    backoff_s: float = 1.0
    """Wait before the first retry, doubled for each later one, jittered ±50% so that
    groups failed by one outage do not all come back at the same moment."""

    def delay_s(self, retry: int) -> float:
        return float(self.backoff_s * 2 ** (retry - 1) * _JITTER.uniform(0.5, 1.5))


async def call_with_retry(
    call: Callable[[int], Awaitable[T]],
    retry: CallRetry,
    what: str,
    on_retry: Callable[[], None],
) -> T:
    """`call(attempt)` until it returns or raises a CallFailed that is not transient, at
    most `retry.attempts` times; `on_retry()` before each retry."""
    for attempt in range(1, retry.attempts + 1):
        try:
            return await call(attempt)
        except CallFailed as exc:
            if not exc.transient or attempt == retry.attempts:
                raise
            delay = retry.delay_s(attempt)
            on_retry()
            logger.warning(
                "%s: %s; try %d of %d in %.2fs", what, exc, attempt + 1, retry.attempts, delay
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable: attempts >= 1")


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None = None

    def capped(self, max_tokens: int | None) -> Sampling:
        """This sampling with at most `max_tokens` generated (a row's own cap)."""
        if max_tokens is None or max_tokens >= self.max_tokens:
            return self
        return dataclasses.replace(self, max_tokens=max_tokens)

    @classmethod
    def from_generation(
        cls, generation: GenerationConfig, temperature: float | None = None
    ) -> Sampling:
        """The recipe's sampling; with `temperature` (validation), at that temperature, where
        greedy (0) turns top-p and top-k off too."""
        if temperature is None:
            return cls(
                temperature=generation.temperature,
                top_p=generation.top_p,
                top_k=generation.top_k,
                max_tokens=generation.max_new_tokens,
                seed=generation.seed,
            )
        sampled = temperature > 0
        return cls(
            temperature=temperature,
            top_p=generation.top_p if sampled else 1.0,
            top_k=generation.top_k if sampled else 0,
            max_tokens=generation.max_new_tokens,
        )


@dataclass(frozen=True)
class Score:
    reward: float
    masked: bool
    info: dict[str, str] = dataclasses.field(default_factory=dict)
    """What the verifier saw (ScoreResult.info); kept for multi-turn episodes, whose
    `calls/<kind>` counts the trainer reads (agent.calls)."""


class RolloutClient:
    """Generate streams and weight publishing against a RolloutService."""

    def __init__(
        self,
        target: str,
        generate_timeout_s: float,
        bucket_bytes: int,
        retry: CallRetry = CallRetry(),
    ) -> None:
        self.target = target
        self.generate_timeout_s = generate_timeout_s
        self.bucket_bytes = bucket_bytes
        self.retry = retry
        self.retries = 0
        """Generate tries repeated after a transient failure, since the client was made."""
        # The channel is made on first use, inside the event loop that will use it (the
        # client itself may be built in a worker thread).
        self._channel: aio.Channel | None = None
        # grpc's stub types describe the blocking API; the aio stub is used untyped.
        self._stub: Any = None
        self._sender: WeightSender | None = None
        self.recompute_kv_cache = False
        """Sent with every update (grpo.recompute_kv_cache_after_weight_updates)."""

    @property
    def stub(self) -> Any:
        if self._stub is None:
            self._channel = connect(self.target, default_timeout_s=60.0)
            self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._sender is not None:
            await self._sender.close()
        if self._channel is not None:
            await self._channel.close()

    async def generate(
        self, request_id: str, prompt_token_ids: Sequence[int], n: int, sampling: Sampling
    ) -> list[rollout_pb2.GenerateResult]:
        """All n samples of one prompt (the stream yields each as it finishes). A transient
        failure regenerates the whole group, under a new request id (`<id>/retry<k>`) so
        that it cannot collide with the abandoned request on the rollout service."""
        return await call_with_retry(
            lambda attempt: self._generate_once(
                request_id if attempt == 1 else f"{request_id}/retry{attempt - 1}",
                prompt_token_ids,
                n,
                sampling,
            ),
            self.retry,
            f"Generate {request_id}",
            self._count_retry,
        )

    def _count_retry(self) -> None:
        self.retries += 1

    async def _generate_once(
        self, request_id: str, prompt_token_ids: Sequence[int], n: int, sampling: Sampling
    ) -> list[rollout_pb2.GenerateResult]:
        request = rollout_pb2.GenerateRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            n=n,
            sampling=rollout_pb2.SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_tokens=sampling.max_tokens,
                seed=sampling.seed,
            ),
        )
        results: list[rollout_pb2.GenerateResult] = []
        try:
            async for result in self.stub.Generate(request, timeout=self.generate_timeout_s):
                results.append(result)
        except aio.AioRpcError as exc:
            raise GenerationFailed(
                f"Generate {request_id} on {self.target}: {exc.code().name} {exc.details()}",
                transient=exc.code() in TRANSIENT_CODES,
                failed_samples=n,
            ) from None
        if len(results) != n or any(
            r.finish_reason == rollout_pb2.FINISH_REASON_ABORT for r in results
        ):
            # The stream ended early or a sample was aborted (a restart, an abort-mode
            # pause): another try can complete the group.
            raise GenerationFailed(
                f"Generate {request_id}: got {len(results)} of {n} samples or an aborted one",
                transient=True,
                failed_samples=n,
            )
        return sorted(results, key=lambda r: r.sample_index)

    async def pause_until_drained(self) -> None:
        """Pause(WAIT): no new request starts; those in flight finish first."""
        await self.stub.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_WAIT))

    async def resume(self) -> None:
        await self.stub.Resume(rollout_pb2.ResumeRequest())

    async def weight_version(self) -> int:
        return (await self.served())[0]

    async def served(self) -> tuple[int, str]:
        """(weight version, model name or path) the rollout service serves now."""
        status = await self.stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30.0)
        return int(status.weight_version), str(status.model)

    async def publish_weights(
        self,
        kind: str,
        version: int,
        tensors: Iterable[tuple[str, torch.Tensor]],
        shared_dir: str | None = None,
    ) -> rollout_pb2.UpdateWeightsResponse:
        """Publish `tensors` as `version` over weight transport `kind`
        (`services.weight_transport`). The sender is made and set up on the first call and
        kept (a collective transport forms its group once); later calls reuse it."""
        if self._sender is None:
            sender = make_sender(
                kind, self.stub, bucket_bytes=self.bucket_bytes, shared_dir=shared_dir
            )
            await sender.init()
            self._sender = sender
        update = WeightPublish(version, recompute_kv_cache=self.recompute_kv_cache)
        return await self._sender.publish(update, tensors)


@dataclass
class GroupScores:
    """A group's scores after retries: None where a sample has none, `problem` says why."""

    scores: list[Score | None]
    problem: str = ""

    @property
    def failed_samples(self) -> int:
        return sum(score is None for score in self.scores)


class RewardClient:
    def __init__(self, target: str, timeout_s: float, retry: CallRetry = CallRetry()) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.retry = retry
        self.retries = 0
        """ScoreGroup tries repeated after a transient failure, since the client was made."""
        self.judge = JudgeTally()
        """Judged groups (genrm_compare) since the collector last took the step's metrics."""
        self._channel: aio.Channel | None = None
        self._stub: Any = None

    @property
    def stub(self) -> Any:
        if self._stub is None:
            self._channel = connect(self.target, default_timeout_s=self.timeout_s)
            self._stub = reward_pb2_grpc.RewardServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def score_group(
        self,
        request_id: str,
        env: str,
        row_json: str,
        texts: Sequence[str],
        num_tokens: Sequence[int],
    ) -> list[Score]:
        """One reward per response, or RewardFailed when any sample is left without one
        after retries (never a silent 0): GRPO's baseline needs the whole group."""
        group = await self.score_samples(request_id, env, row_json, texts, num_tokens)
        if group.failed_samples:
            raise RewardFailed(
                f"ScoreGroup {request_id} ({env}): {group.failed_samples} of "
                f"{len(texts)} samples failed: {group.problem}",
                transient=False,
                failed_samples=group.failed_samples,
            )
        return [score for score in group.scores if score is not None]

    async def score_samples(
        self,
        request_id: str,
        env: str,
        row_json: str,
        texts: Sequence[str],
        num_tokens: Sequence[int],
    ) -> GroupScores:
        """Each response's score, None where its failure outlived the retries; raises
        RewardFailed only when the call itself failed. A retry resends the whole group
        (group-aware environments score responses against each other) and each sample
        keeps the first score it gets."""
        request = reward_pb2.ScoreGroupRequest(
            request_id=request_id,
            env=env,
            row_json=row_json,
            responses=[
                reward_pb2.Response(text=text, num_tokens=count)
                for text, count in zip(texts, num_tokens, strict=True)
            ],
        )
        group = GroupScores([None] * len(texts))

        async def attempt(_: int) -> GroupScores:
            await self._score_once(request, group)
            return group

        try:
            return await call_with_retry(
                attempt, self.retry, f"ScoreGroup {request_id}", self._count_retry
            )
        except SamplesFailed:
            return group

    def _count_retry(self) -> None:
        self.retries += 1

    async def _score_once(self, request: reward_pb2.ScoreGroupRequest, group: GroupScores) -> None:
        """One ScoreGroup call merged into `group`; RewardFailed (transient when every
        failure left is) while samples still lack a score."""
        name = f"ScoreGroup {request.request_id} ({request.env})"
        started = time.monotonic()
        try:
            reply = await self.stub.ScoreGroup(request, timeout=self.timeout_s)
        except aio.AioRpcError as exc:
            raise RewardFailed(
                f"{name} on {self.target}: {exc.code().name} {exc.details()}",
                transient=exc.code() in TRANSIENT_CODES,
                failed_samples=len(group.scores),
            ) from None
        if len(reply.results) != len(group.scores):
            raise RewardFailed(
                f"{name}: {len(reply.results)} results for {len(group.scores)} responses",
                transient=False,
                failed_samples=len(group.scores),
            )
        calls = judge_calls_of(result.info for result in reply.results)
        if calls is not None:
            self.judge.record(calls, started, time.monotonic())
        kinds: list[int] = []
        for index, result in enumerate(reply.results):
            if group.scores[index] is not None:
                continue
            if result.failure_kind == reward_pb2.FAILURE_KIND_NONE:
                group.scores[index] = Score(reward=result.reward, masked=result.mask_sample)
                continue
            if not kinds:
                kind = reward_pb2.FailureKind.Name(result.failure_kind)
                group.problem = f"{kind}: {result.failure_reason}"
            kinds.append(result.failure_kind)
        logger.debug("scored %s in %.3fs", request.request_id, time.monotonic() - started)
        if kinds:
            raise SamplesFailed(
                f"{name}: {len(kinds)} of {len(group.scores)} samples failed: {group.problem}",
                transient=all(kind in TRANSIENT_REWARD_FAILURES for kind in kinds),
                failed_samples=len(kinds),
            )
