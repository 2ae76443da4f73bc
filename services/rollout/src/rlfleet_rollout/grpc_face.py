"""The gRPC face: proto ↔ domain translation over an `Engine`; no generation logic here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from grpc import aio
from rlfleet_core.errors import InvalidArgument
from rlfleet_core.versions import build_info
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_weights.base import IncomingWeights, WeightRequestError
from rlfleet_weights.factory import group_kind_of, stream_receiver, update_receiver
from rlfleet_weights.filesystem import check_weights_path

from rlfleet_rollout import metrics
from rlfleet_rollout.config import RolloutServiceConfig
from rlfleet_rollout.engines.base import Engine
from rlfleet_rollout.engines.updates import check_newer
from rlfleet_rollout.types import (
    FinishReason,
    PauseMode,
    Sample,
    TransferGroup,
    UpdateResult,
    WeightUpdate,
)
from rlfleet_rollout.validation import generate_input_from_proto

logger = logging.getLogger(__name__)

_FINISH = {
    FinishReason.STOP: rollout_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: rollout_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: rollout_pb2.FINISH_REASON_ABORT,
}
_PAUSE = {
    rollout_pb2.PAUSE_MODE_UNSPECIFIED: PauseMode.KEEP,
    rollout_pb2.PAUSE_MODE_KEEP: PauseMode.KEEP,
    rollout_pb2.PAUSE_MODE_WAIT: PauseMode.WAIT,
    rollout_pb2.PAUSE_MODE_ABORT: PauseMode.ABORT,
}


def sample_to_proto(sample: Sample) -> rollout_pb2.GenerateResult:
    return rollout_pb2.GenerateResult(
        request_id=sample.request_id,
        sample_index=sample.index,
        prompt_token_ids=sample.prompt_token_ids,
        token_ids=sample.token_ids,
        logprobs=sample.logprobs,
        finish_reason=_FINISH[sample.finish_reason],
        text=sample.text,
        weight_version_first=sample.weight_version_first,
        weight_version_last=sample.weight_version_last,
        generation_time_s=sample.generation_time_s,
        replica=sample.replica,
    )


def _update_response(result: UpdateResult) -> rollout_pb2.UpdateWeightsResponse:
    metrics.record_update(result)
    return rollout_pb2.UpdateWeightsResponse(
        weight_version=result.version,
        bytes_received=result.bytes_received,
        transfer_time_s=result.transfer_time_s,
        apply_time_s=result.apply_time_s,
    )


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, config: RolloutServiceConfig, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self._update_order = asyncio.Lock()

    async def Generate(
        self, request: rollout_pb2.GenerateRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[rollout_pb2.GenerateResult]:
        engine = self.engine
        gen_input = generate_input_from_proto(
            request,
            vocab_size=engine.vocab_size,
            max_model_len=engine.max_model_len,
            max_samples=self.config.max_samples_per_request,
        )
        async for sample in engine.generate(gen_input):
            metrics.record_sample(sample, "grpc")
            yield sample_to_proto(sample)

    async def InitWeightTransfer(
        self, request: rollout_pb2.InitWeightTransferRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.InitWeightTransferResponse:
        with _invalid_argument():
            backend = group_kind_of(request.transport)
        if not request.master_address:
            raise InvalidArgument("master_address", "must be the host of the sender's TCPStore")
        if not 0 < request.master_port < 65536:
            raise InvalidArgument("master_port", f"must be a port, got {request.master_port}")
        if request.world_size < 2 or not 1 <= request.rank_offset < request.world_size:
            raise InvalidArgument(
                "rank_offset",
                f"must be within [1, world_size={request.world_size}) (rank 0 is the sender)",
            )
        group = TransferGroup(
            backend=backend,
            master_address=request.master_address,
            master_port=request.master_port,
            world_size=request.world_size,
            rank_offset=request.rank_offset,
            timeout_s=request.timeout_s if request.timeout_s > 0 else 120.0,
        )
        joined = await self.engine.init_weight_transfer(group)
        return rollout_pb2.InitWeightTransferResponse(num_workers=joined)

    async def UpdateWeights(
        self, request: rollout_pb2.UpdateWeightsRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.UpdateWeightsResponse:
        # One UpdateWeights at a time, in arrival order (asyncio.Lock is FIFO): reading a
        # file in a thread must not let a later version's smaller file overtake it.
        async with self._update_order:
            with _invalid_argument():
                receiver = update_receiver(request.transport)
                if request.transport == rollout_pb2.WEIGHT_TRANSPORT_SHARED_FILE:
                    check_weights_path(
                        request.file_path, self.config.weight_file_roots, "weight_file_roots"
                    )
                    # Refuse a stale version before reading gigabytes, not after.
                    check_newer(
                        request.weight_version,
                        self.engine.weight_version,
                        self.config.max_weight_version_jump,
                    )
                # A safetensors read takes seconds per GB: off the event loop, so that
                # generation, health checks and other calls go on meanwhile.
                incoming = await asyncio.to_thread(receiver.receive, request)
            return await self._update(request, incoming)

    async def StreamWeights(
        self,
        request_iterator: AsyncIterator[rollout_pb2.WeightChunk],
        context: aio.ServicerContext[Any, Any],
    ) -> rollout_pb2.UpdateWeightsResponse:
        def check_header(header: rollout_pb2.UpdateWeightsRequest) -> None:
            # Refuse a stale version before the tensors arrive, not after.
            check_newer(
                header.weight_version,
                self.engine.weight_version,
                self.config.max_weight_version_jump,
            )

        with _invalid_argument():
            header, incoming = await stream_receiver().receive_stream(
                request_iterator, check_header
            )
        return await self._update(header, incoming)

    async def _update(
        self, request: rollout_pb2.UpdateWeightsRequest, incoming: IncomingWeights
    ) -> rollout_pb2.UpdateWeightsResponse:
        update = WeightUpdate(
            request.weight_version,
            plan=incoming.plan,
            tensors=incoming.tensors,
            recompute_kv_cache=self._recompute(request),
        )
        return _update_response(await self.engine.update_weights(update))

    def _recompute(self, request: rollout_pb2.UpdateWeightsRequest) -> bool:
        return request.recompute_kv_cache or self.config.recompute_kv_cache

    async def Pause(
        self, request: rollout_pb2.PauseRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.PauseResponse:
        in_flight = await self.engine.pause(_PAUSE[request.mode])
        return rollout_pb2.PauseResponse(requests_in_flight=in_flight)

    async def Resume(
        self, request: rollout_pb2.ResumeRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.ResumeResponse:
        await self.engine.resume()
        return rollout_pb2.ResumeResponse()

    async def GetStatus(
        self, request: rollout_pb2.GetStatusRequest, context: aio.ServicerContext[Any, Any]
    ) -> rollout_pb2.RolloutStatus:
        status = self.engine.status()
        return rollout_pb2.RolloutStatus(
            weight_version=status.weight_version,
            paused=status.paused,
            requests_waiting=status.requests_waiting,
            requests_running=status.requests_running,
            tokens_per_s=status.tokens_per_s,
            tokens_generated=status.tokens_generated,
            engine=self.config.engine,
            model=self.config.model_id,
            num_replicas=status.num_replicas,
            build=build_info("rollout", "rlfleet-rollout"),
        )


@contextmanager
def _invalid_argument() -> Iterator[None]:
    """A request the weight receiver cannot read is INVALID_ARGUMENT naming its field."""
    try:
        yield
    except WeightRequestError as exc:
        raise InvalidArgument(exc.field, str(exc)) from None
