"""The trainer's side of the rollout and reward protos: generate a prompt's group, score
it, publish weights. Every call has a deadline (rlfleet_core.client.connect) and a
failure is an exception naming the prompt and the status, never a silent default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from grpc import aio
from rlfleet_contracts.recipe import GenerationConfig
from rlfleet_contracts.reward_client import score_group_problem
from rlfleet_core.client import connect
from rlfleet_proto.v1 import (
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet_weights.base import WeightPublish, WeightSender
from rlfleet_weights.factory import make_sender

logger = logging.getLogger(__name__)


class GenerationFailed(RuntimeError):
    pass


class RewardFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None = None

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


class RolloutClient:
    """Generate streams and weight publishing against a RolloutService."""

    def __init__(self, target: str, generate_timeout_s: float, bucket_bytes: int) -> None:
        self.target = target
        self.generate_timeout_s = generate_timeout_s
        self.bucket_bytes = bucket_bytes
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
        """All n samples of one prompt (the stream yields each as it finishes)."""
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
                f"Generate {request_id} on {self.target}: {exc.code().name} {exc.details()}"
            ) from None
        if len(results) != n or any(
            r.finish_reason == rollout_pb2.FINISH_REASON_ABORT for r in results
        ):
            raise GenerationFailed(
                f"Generate {request_id}: got {len(results)} of {n} samples or an aborted one"
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


class RewardClient:
    def __init__(self, target: str, timeout_s: float) -> None:
        self.target = target
        self.timeout_s = timeout_s
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
        """One reward per response; any failure fails the whole group (never a silent 0)."""
        request = reward_pb2.ScoreGroupRequest(
            request_id=request_id,
            env=env,
            row_json=row_json,
            responses=[
                reward_pb2.Response(text=text, num_tokens=count)
                for text, count in zip(texts, num_tokens, strict=True)
            ],
        )
        started = time.monotonic()
        try:
            reply = await self.stub.ScoreGroup(request, timeout=self.timeout_s)
        except aio.AioRpcError as exc:
            raise RewardFailed(
                f"ScoreGroup {request_id} ({env}) on {self.target}: "
                f"{exc.code().name} {exc.details()}"
            ) from None
        problem = score_group_problem(reply, len(texts))
        if problem:
            raise RewardFailed(f"ScoreGroup {request_id} ({env}): {problem}")
        logger.debug("scored %s in %.3fs", request_id, time.monotonic() - started)
        return [Score(reward=r.reward, masked=r.mask_sample) for r in reply.results]
