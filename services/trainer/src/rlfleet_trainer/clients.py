"""The trainer's side of the rollout and reward protos: generate a prompt's group, score
it, publish weights. Every call has a deadline (rlfleet_core.client.connect) and a
failure is an exception naming the prompt and the status, never a silent default.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from grpc import aio
from rlfleet_contracts.recipe import GenerationConfig
from rlfleet_contracts.reward_client import score_group_problem
from rlfleet_core.client import connect
from rlfleet_proto.v1 import (
    common_pb2,
    reward_pb2,
    reward_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
)
from safetensors.torch import save_file

logger = logging.getLogger(__name__)

TORCH_TO_DTYPE = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
    torch.float16: common_pb2.DTYPE_FLOAT16,
    torch.float64: common_pb2.DTYPE_FLOAT64,
    torch.int64: common_pb2.DTYPE_INT64,
    torch.int32: common_pb2.DTYPE_INT32,
    torch.uint8: common_pb2.DTYPE_UINT8,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_TO_DTYPE.items()}


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
        self.group: Any = None
        """The weight group (rlfleet_weights.buckets.WeightGroup) once formed."""
        self.transport = rollout_pb2.WEIGHT_TRANSPORT_UNSPECIFIED
        self.recompute_kv_cache = False
        """Sent with every update (grpo.recompute_kv_cache_after_weight_updates)."""

    @property
    def stub(self) -> Any:
        if self._stub is None:
            self._channel = connect(self.target, default_timeout_s=60.0)
            self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
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

    async def publish_stream(
        self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> rollout_pb2.UpdateWeightsResponse:
        """StreamWeights: a header with every tensor's spec, then raw chunks in order
        (rlfleet_weights.buckets' wire layout, which the rollout's assembler checks)."""
        from rlfleet_weights.buckets import iter_weight_chunks

        state = {name: t.detach().cpu().contiguous() for name, t in tensors}
        header = rollout_pb2.UpdateWeightsRequest(
            weight_version=version,
            bucket_bytes=self.bucket_bytes,
            recompute_kv_cache=self.recompute_kv_cache,
        )

        async def messages() -> AsyncIterator[rollout_pb2.WeightChunk]:
            for message in iter_weight_chunks(header, state, min(self.bucket_bytes, 16 << 20)):
                yield message

        reply: rollout_pb2.UpdateWeightsResponse = await self.stub.StreamWeights(
            messages(), timeout=600.0
        )
        return reply

    async def init_collective(self, backend: str, timeout_s: float = 120.0) -> None:
        """Form the trainer(rank 0)↔engine weight group once: InitWeightTransfer and our
        side of the rendezvous run concurrently (each blocks until the other joins)."""
        import socket

        from rlfleet_weights.buckets import GroupSpec, WeightGroup

        status = await self.stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30.0)
        workers = max(int(status.num_replicas), 1)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        spec = GroupSpec("127.0.0.1", port, 1 + workers, 0, backend, timeout_s)
        transport = (
            rollout_pb2.WEIGHT_TRANSPORT_NCCL
            if backend == "nccl"
            else rollout_pb2.WEIGHT_TRANSPORT_GLOO
        )
        request = rollout_pb2.InitWeightTransferRequest(
            transport=transport,
            master_address="127.0.0.1",
            master_port=port,
            world_size=1 + workers,
            rank_offset=1,
            timeout_s=timeout_s,
        )
        group_task = asyncio.create_task(asyncio.to_thread(WeightGroup, spec))
        await self.stub.InitWeightTransfer(request, timeout=timeout_s + 10)
        self.group = await group_task
        self.transport = transport

    async def publish_collective(
        self, version: int, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> rollout_pb2.UpdateWeightsResponse:
        """UpdateWeights(GLOO/NCCL) with the tensor list; the buckets go by broadcast."""
        from rlfleet_weights.buckets import send_weights, specs_of

        state = {name: t.detach().contiguous() for name, t in tensors}
        request = rollout_pb2.UpdateWeightsRequest(
            weight_version=version,
            transport=self.transport,
            tensors=specs_of(state),
            bucket_bytes=self.bucket_bytes,
            recompute_kv_cache=self.recompute_kv_cache,
        )
        call: asyncio.Future[rollout_pb2.UpdateWeightsResponse] = asyncio.ensure_future(
            self.stub.UpdateWeights(request, timeout=600.0)
        )
        await asyncio.to_thread(send_weights, self.group, state, self.bucket_bytes)
        reply: rollout_pb2.UpdateWeightsResponse = await call
        return reply

    async def publish_shared_file(
        self, version: int, tensors: Iterable[tuple[str, torch.Tensor]], shared_dir: Path
    ) -> rollout_pb2.UpdateWeightsResponse:
        """Write a safetensors file the rollout can read, then UpdateWeights(SHARED_FILE)."""
        items = {name: t.detach().cpu().clone().contiguous() for name, t in tensors}
        shared_dir.mkdir(parents=True, exist_ok=True)
        final = shared_dir / f"weights_v{version}.safetensors"
        tmp = final.with_suffix(".tmp")
        save_file(items, str(tmp))
        tmp.replace(final)  # the reader never sees a half-written file
        request = rollout_pb2.UpdateWeightsRequest(
            weight_version=version,
            transport=rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE,
            tensors=[tensor_spec(n, t) for n, t in items.items()],
            file_path=str(final),
        )
        reply: rollout_pb2.UpdateWeightsResponse = await self.stub.UpdateWeights(
            request, timeout=600.0
        )
        for old in shared_dir.glob("weights_v*.safetensors"):
            if old != final:
                old.unlink(missing_ok=True)
        return reply


def tensor_spec(name: str, tensor: torch.Tensor) -> common_pb2.TensorSpec:
    if tensor.dtype not in TORCH_TO_DTYPE:
        raise ValueError(f"{name}: dtype {tensor.dtype} cannot travel on the wire")
    return common_pb2.TensorSpec(
        name=name, shape=list(tensor.shape), dtype=TORCH_TO_DTYPE[tensor.dtype]
    )


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
