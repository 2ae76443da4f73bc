"""Two hf replicas behind one service; a broadcast update whose sender is killed midway.

Done-when of issue 12 for the pool: every replica still serves the previous version
(same version, logprobs of the previous weights on both replicas), and the next update
lands on both. Runs in a fresh interpreter, as `test_pool.py` does (Ray's processes go
with the scenario's session).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from rollout_scenarios import run_scenario

pytestmark = [
    pytest.mark.slow,
    pytest.mark.budget(180, "a Ray pool of replicas, an update killed mid-transfer"),
]

PROMPT = [1, 300, 301, 302, 201]
SCENARIO_TIMEOUT_S = 240.0
BUCKET_BYTES = 64 << 10
GROUP_TIMEOUT_S = 30.0

SENDER = """
import sys, time, torch
from rlfleet_weights.collective import GroupSpec, WeightGroup
from rlfleet_weights.plan import pack_bucket, plan_buckets, specs_of
from transformers import AutoModelForCausalLM

port, bucket_bytes, timeout_s, model = sys.argv[1:5]
base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
gen = torch.Generator().manual_seed(2)
weights = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()}
print("ready", flush=True)
group = WeightGroup(GroupSpec("127.0.0.1", int(port), 3, 0, "gloo", float(timeout_s)))
plan = plan_buckets(specs_of(weights), int(bucket_bytes))
for bucket in plan.buckets[: len(plan.buckets) // 2]:
    group.broadcast(pack_bucket(bucket, weights))
print("half", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 90)
def test_pool_update_killed_mid_transfer_keeps_every_replica_on_the_previous_version() -> None:
    run_scenario(__file__, timeout_s=SCENARIO_TIMEOUT_S)


async def scenario() -> None:
    import socket
    import threading

    import grpc
    import torch
    from grpc import aio
    from rlfleet_core.client import connect
    from rlfleet_core.models import resolve_model
    from rlfleet_core.testing import running_service
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_rollout.service import SERVICE
    from rlfleet_weights.grpc_stream import iter_weight_chunks
    from rlfleet_weights.plan import specs_of
    from transformers import AutoModelForCausalLM

    model_path = resolve_model("tiny")
    reference = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    base = {k: v.clone() for k, v in reference.state_dict().items()}

    def noisy(seed: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in base.items()}

    @torch.no_grad()
    def ref_logprobs(weights: dict[str, torch.Tensor], tokens: list[int]) -> list[float]:
        reference.load_state_dict(weights)
        logp = torch.log_softmax(reference(input_ids=torch.tensor([PROMPT + tokens])).logits[0], -1)
        return [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]

    overrides = [
        "engine=hf",
        "model=tiny",
        "replicas=2",
        "ray_num_cpus=2",
        "ray_start_timeout_s=180",
        "ray_call_timeout_s=30",
        "update_timeout_s=90",
    ]
    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=120) as channel,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)

        async def both_replicas() -> list[Any]:
            request = rollout_pb2.GenerateRequest(
                prompt_token_ids=PROMPT,
                n=2,
                sampling=rollout_pb2.SamplingParams(
                    max_tokens=16, temperature=0.0, ignore_eos=True
                ),
            )

            async def one(i: int) -> list[Any]:
                request.request_id = f"r{i}-{time.monotonic()}"
                return [r async for r in stub.Generate(request, timeout=180)]

            batches = await asyncio.gather(*(one(i) for i in range(4)))
            results = [r for batch in batches for r in batch]
            assert {r.replica for r in results} == {"hf-0", "hf-1"}
            return results

        def check(results: list[Any], weights: dict[str, torch.Tensor], version: int) -> None:
            for r in results:
                assert r.weight_version_first == r.weight_version_last == version
                want = ref_logprobs(weights, list(r.token_ids))
                worst = max(abs(a - b) for a, b in zip(r.logprobs, want, strict=True))
                assert worst < 1e-4, (r.replica, worst)

        previous = noisy(1)
        chunks = list(
            iter_weight_chunks(rollout_pb2.UpdateWeightsRequest(weight_version=1), previous)
        )

        async def source() -> Any:
            for c in chunks:
                yield c

        assert (await stub.StreamWeights(source(), timeout=120)).weight_version == 1
        check(await both_replicas(), previous, 1)
        print("v1 served by both replicas", flush=True)

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        sender = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SENDER,
                str(port),
                str(BUCKET_BYTES),
                str(GROUP_TIMEOUT_S),
                str(model_path),
            ],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

        def read_line(want: str, timeout_s: float) -> None:
            box: list[str] = []
            t = threading.Thread(target=lambda: box.append(sender.stdout.readline()), daemon=True)  # type: ignore[union-attr]
            t.start()
            t.join(timeout_s)
            assert box and box[0].strip() == want, (box, want)

        try:
            await asyncio.to_thread(read_line, "ready", 120)
            joined = await stub.InitWeightTransfer(
                rollout_pb2.InitWeightTransferRequest(
                    transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
                    master_address="127.0.0.1",
                    master_port=port,
                    world_size=3,
                    rank_offset=1,
                    timeout_s=GROUP_TIMEOUT_S,
                ),
                timeout=GROUP_TIMEOUT_S + 30,
            )
            assert joined.num_workers == 2
            update = asyncio.ensure_future(
                stub.UpdateWeights(
                    rollout_pb2.UpdateWeightsRequest(
                        weight_version=2,
                        transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
                        tensors=specs_of(previous),
                        bucket_bytes=BUCKET_BYTES,
                    ),
                    timeout=150,
                )
            )
            await asyncio.to_thread(read_line, "half", 60)
            os.killpg(sender.pid, signal.SIGKILL)
            try:
                await update
                raise AssertionError("an update whose sender died was accepted")
            except aio.AioRpcError as exc:
                print(f"killed update: {exc.code()} {exc.details()}", flush=True)
                refused = exc
        finally:
            if sender.poll() is None:
                os.killpg(sender.pid, signal.SIGKILL)
            sender.wait()

        await asyncio.sleep(0.6)  # one status poll
        status = await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)
        assert status.weight_version == 1 and status.num_replicas == 2
        check(await both_replicas(), previous, 1)
        assert refused.code() == grpc.StatusCode.ABORTED, refused.details()
        print("v1 still served by both replicas", flush=True)

        nxt = noisy(3)
        chunks = list(iter_weight_chunks(rollout_pb2.UpdateWeightsRequest(weight_version=2), nxt))
        assert (await stub.StreamWeights(source(), timeout=120)).weight_version == 2
        check(await both_replicas(), nxt, 2)
        print("v2 served by both replicas", flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_S))
    print("scenario passed", flush=True)
