"""The trainer's side of the rollout proto: generate a prompt's group, publish weights
(scores come from `rlfleet_contracts.reward_client.RewardClient`). Every call has a
deadline (rlfleet_core.client.connect) and a failure is an exception naming the prompt and
the status, never a silent default.

Generate is retried on transient failures (`rlfleet_core.calls.CallRetry`, from
`services.call_attempts` / `services.retry_backoff_s`): the status codes in
`rlfleet_core.calls.TRANSIENT_CODES` and an aborted or missing sample. The channel's own gRPC retry
(UNAVAILABLE before the first response) still runs inside each try.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from grpc import aio
from rlfleet_contracts.recipe import GenerationConfig
from rlfleet_core.calls import (
    DEFAULT_RETRY,
    CallFailed,
    CallRetry,
    RpcFailure,
    call_with_retry,
)
from rlfleet_core.client import connect
from rlfleet_proto.v1 import (
    rollout_pb2,
    rollout_pb2_grpc,
)
from rlfleet_weights.base import WeightPublish, WeightSender

logger = logging.getLogger(__name__)


class GenerationFailed(CallFailed):
    pass


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None = None

    def for_group(
        self, index: int, group_size: int, max_tokens: int | None, offset: int = 0
    ) -> Sampling:
        """This sampling for the group of prompt `index` (capped at the row's `max_tokens`):
        when seeded, at `seed + offset + index × group_size` (the engine gives sample k of
        the group that + k), so every group of a stream draws seeds of its own."""
        mine = self.capped(max_tokens)
        if mine.seed is None:
            return mine
        return dataclasses.replace(mine, seed=mine.seed + offset + index * group_size)

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
        greedy (0) turns top-p and top-k off too (the seed is kept: the caller offsets it)."""
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
            seed=generation.seed,
        )


class RolloutStub:
    """The RolloutService aio stub of `target`; attribute access is the stub's RPCs. The
    channel is made on first use, inside the event loop that will use it: the client and
    the weight sender holding this stub may be built in a worker thread (build_context is)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._channel: aio.Channel | None = None
        # grpc's stub types describe the blocking API; the aio stub is used untyped.
        self._stub: Any = None

    def __getattr__(self, rpc: str) -> Any:
        if rpc.startswith("_"):  # not an RPC: copy or pickle probing the object
            raise AttributeError(rpc)
        if self._stub is None:
            self._channel = connect(self.target, default_timeout_s=60.0)
            self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        return getattr(self._stub, rpc)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()


class RolloutClient:
    """Generate streams and weight publishing against a RolloutService."""

    def __init__(
        self,
        target: str | RolloutStub,
        generate_timeout_s: float,
        retry: CallRetry = DEFAULT_RETRY,
        *,
        sender: WeightSender | None = None,
    ) -> None:
        """`target`: the service's address, or the stub `sender` was made with (they then
        share one channel); `sender`: the weight transport `publish_weights` sends over
        (context.rollout_client makes it from `services.weight_transport`); None for a
        client that only generates."""
        self.stub = RolloutStub(target) if isinstance(target, str) else target
        self.target = self.stub.target
        self.generate_timeout_s = generate_timeout_s
        self.retry = retry
        self.retries = 0
        """Generate tries repeated after a transient failure, since the client was made."""
        self.sender = sender
        self._sender_ready = False

    async def close(self) -> None:
        if self.sender is not None and self._sender_ready:
            await self.sender.close()
        await self.stub.close()

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
            # A streaming call, so not through Endpoint.call; the same message and
            # transient rule as every unary call's (rlfleet_core.calls.RpcFailure).
            rpc = RpcFailure(
                "rollout", "Generate", self.target, exc.code(), str(exc.details()), request_id
            )
            raise GenerationFailed(
                rpc.message,
                transient=rpc.transient,
                failed_samples=n,
                rpc=rpc,
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
        version: int,
        tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        recompute_kv_cache: bool,
    ) -> rollout_pb2.UpdateWeightsResponse:
        """Publish `tensors` as `version` over the client's weight sender, asking the
        rollout to recompute the KV cache of requests in flight or not
        (`grpo.recompute_kv_cache_after_weight_updates`). The sender is set up on the first
        call (a collective transport forms its group once) and kept."""
        if self.sender is None:
            raise RuntimeError(
                f"the rollout client of {self.target} has no weight sender: build it with "
                "one (context.rollout_client makes it from services.weight_transport)"
            )
        if not self._sender_ready:
            await self.sender.init()
            self._sender_ready = True
        update = WeightPublish(version, recompute_kv_cache=recompute_kv_cache)
        return await self.sender.publish(update, tensors)
