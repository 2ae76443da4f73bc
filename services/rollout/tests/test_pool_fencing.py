"""Two hf replicas behind one service; ONE replica fails an update (real faults).

- deadline: one replica's process is frozen (SIGSTOP) before the update, so it does not
  answer within `update_timeout_s`.
- killed: one replica's process is killed (SIGKILL) before the update.
- late: a broadcast whose sender stalls past `update_timeout_s` on every replica, then
  finishes: the replicas' receives (threads, not stoppable) complete after the pool
  gave up. They must not serve that version under the pool's previous one.

What the pool promises (pool.py, docs/rollout.md): the update succeeds with the pool on
the new version when at least one replica took it; the replica left behind is out of
rotation (`num_replicas` in GetStatus counts the rest) and no request reaches it, so
every sample is served on the pool's version with the new weights' logprobs. A frozen
replica that wakes up comes back with the next update that lands on it. Runs in a fresh
interpreter, as `test_pool.py` does (Ray's processes go with the scenario's session).
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
    pytest.mark.budget(
        240, "a Ray pool of replicas per scenario, with a replica stalled past its deadline"
    ),
]

PROMPT = [1, 300, 301, 302, 201]
SCENARIO_TIMEOUT_S = 300.0
UPDATE_TIMEOUT_S = 20.0
RAY_CALL_TIMEOUT_S = 15.0
GROUP_TIMEOUT_S = 180.0
BUCKET_BYTES = 64 << 10
REQUESTS = 6
"""Concurrent Generate calls (n=2 each) per check: with two replicas in rotation the
least-loaded pick spreads them over both."""


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
half = len(plan.buckets) // 2
for bucket in plan.buckets[:half]:
    group.broadcast(pack_bucket(bucket, weights))
print("half", flush=True)
sys.stdin.readline()
for bucket in plan.buckets[half:]:
    group.broadcast(pack_bucket(bucket, weights))
print("done", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 90)
def test_pool_replica_past_update_deadline_leaves_rotation_then_rejoins() -> None:
    print(run_scenario(__file__, "deadline", timeout_s=SCENARIO_TIMEOUT_S)[-1500:])


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 90)
def test_pool_killed_replica_leaves_rotation_and_the_other_serves_the_new_version() -> None:
    print(run_scenario(__file__, "killed", timeout_s=SCENARIO_TIMEOUT_S)[-1500:])


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 90)
def test_pool_update_landing_after_the_deadline_is_never_served() -> None:
    print(run_scenario(__file__, "late", timeout_s=SCENARIO_TIMEOUT_S)[-1500:])


def replica_pids() -> list[int]:
    """The Ray worker processes holding a replica (descendants of this driver: Ray's
    raylet starts them; Ray titles an actor's process `ray::ReplicaActor`)."""
    import psutil

    pids = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "ray::ReplicaActor" in " ".join(proc.cmdline()):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


async def late_broadcast(stub: Any, model_path: Any) -> None:
    """Version 2 by broadcast; the sender stalls after half the buckets until the pool
    has given up (ABORTED), then sends the rest, so the replicas load it late."""
    import socket
    import threading

    import grpc
    import torch
    from grpc import aio
    from rlfleet_proto.v1 import rollout_pb2
    from rlfleet_weights.plan import specs_of
    from transformers import AutoModelForCausalLM

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = [str(port), str(BUCKET_BYTES), str(GROUP_TIMEOUT_S), str(model_path)]
    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER, *args],
        stdin=subprocess.PIPE,
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
            timeout=120,
        )
        assert joined.num_workers == 2
        specs = specs_of(
            AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
        )
        start = time.monotonic()
        with pytest.raises(aio.AioRpcError) as info:
            await stub.UpdateWeights(
                rollout_pb2.UpdateWeightsRequest(
                    weight_version=2,
                    transport=rollout_pb2.WEIGHT_TRANSPORT_GLOO,
                    tensors=specs,
                    bucket_bytes=BUCKET_BYTES,
                ),
                timeout=UPDATE_TIMEOUT_S + RAY_CALL_TIMEOUT_S + 60,
            )
        print(
            f"stalled update: {time.monotonic() - start:.1f}s, {info.value.details()}", flush=True
        )
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value.details()
        await asyncio.to_thread(read_line, "half", 10)
        sender.stdin.write("go\n")  # type: ignore[union-attr]
        sender.stdin.flush()  # type: ignore[union-attr]
        await asyncio.to_thread(read_line, "done", 60)
    finally:
        if sender.poll() is None:
            os.killpg(sender.pid, signal.SIGKILL)
        sender.wait()
    await asyncio.sleep(3)  # the replicas' receive threads copy version 2 in


async def scenario(mode: str) -> None:
    import grpc
    import torch
    from grpc import aio
    from rlfleet_core.client import connect
    from rlfleet_core.models import resolve_model
    from rlfleet_core.testing import running_service
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc
    from rlfleet_rollout.service import SERVICE
    from rlfleet_weights.grpc_stream import iter_weight_chunks
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
        f"ray_call_timeout_s={RAY_CALL_TIMEOUT_S:g}",
        f"update_timeout_s={UPDATE_TIMEOUT_S:g}",
    ]
    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}", default_timeout_s=120) as channel,
    ):
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)

        async def served(weights: dict[str, torch.Tensor], version: int) -> set[str]:
            """Concurrent Generates: every sample on `version`, with `weights`' logprobs.
            Returns the replicas that served them."""
            request = rollout_pb2.GenerateRequest(
                prompt_token_ids=PROMPT,
                n=2,
                sampling=rollout_pb2.SamplingParams(
                    max_tokens=16, temperature=0.0, ignore_eos=True
                ),
            )

            async def one(i: int) -> list[Any]:
                request.request_id = f"r{version}-{i}-{time.monotonic()}"
                return [r async for r in stub.Generate(request, timeout=120)]

            batches = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
            results = [r for batch in batches for r in batch]
            assert len(results) == 2 * REQUESTS
            for r in results:
                assert r.weight_version_first == r.weight_version_last == version, (
                    r.replica,
                    r.weight_version_first,
                    r.weight_version_last,
                    version,
                )
                want = ref_logprobs(weights, list(r.token_ids))
                worst = max(abs(a - b) for a, b in zip(r.logprobs, want, strict=True))
                assert worst < 1e-4, (r.replica, worst)
            return {r.replica for r in results}

        async def stream(weights: dict[str, torch.Tensor], version: int, timeout: float) -> Any:
            chunks = list(
                iter_weight_chunks(
                    rollout_pb2.UpdateWeightsRequest(weight_version=version), weights
                )
            )

            async def source() -> Any:
                for c in chunks:
                    yield c

            return await stub.StreamWeights(source(), timeout=timeout)

        async def status() -> Any:
            await asyncio.sleep(0.6)  # one status poll
            return await stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=30)

        v1 = noisy(1)
        assert (await stream(v1, 1, 120)).weight_version == 1
        assert await served(v1, 1) == {"hf-0", "hf-1"}
        if mode == "late":
            await late_broadcast(stub, model_path)
            # Out of rotation until an update lands: no sample on any version.
            with pytest.raises(aio.AioRpcError) as info:
                await served(v1, 1)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
            got = await status()
            assert (got.weight_version, got.num_replicas) == (1, 0), got
            v3 = noisy(3)
            assert (await stream(v3, 3, 120)).weight_version == 3
            got = await status()
            assert (got.weight_version, got.num_replicas) == (3, 2), got
            assert await served(v3, 3) == {"hf-0", "hf-1"}
            print("v3 served by both replicas", flush=True)
            return
        pids = replica_pids()
        assert len(pids) == 2, pids
        victim = pids[0]
        print(f"v1 served by both replicas; replica processes {pids}", flush=True)

        v2 = noisy(2)
        # The frozen replica costs update_timeout_s, then ray_call_timeout_s for its
        # status: the deadline below leaves room for both on a loaded host.
        deadline = UPDATE_TIMEOUT_S + RAY_CALL_TIMEOUT_S + 60
        if mode == "deadline":
            os.kill(victim, signal.SIGSTOP)
        else:
            os.kill(victim, signal.SIGKILL)
        try:
            start = time.monotonic()
            reply = await stream(v2, 2, deadline)
            print(f"update with one replica {mode}: {time.monotonic() - start:.1f}s", flush=True)
            assert reply.weight_version == 2
            got = await status()
            assert (got.weight_version, got.num_replicas) == (2, 1), got
            alone = await served(v2, 2)
            assert len(alone) == 1, alone
            print(f"v2 served by {alone} only", flush=True)
        finally:
            if mode == "deadline":
                os.kill(victim, signal.SIGCONT)

        v3 = noisy(3)
        assert (await stream(v3, 3, deadline)).weight_version == 3
        got = await status()
        if mode == "deadline":
            # Awake again, the late replica took version 3 too: back in rotation.
            assert (got.weight_version, got.num_replicas) == (3, 2), got
            assert await served(v3, 3) == {"hf-0", "hf-1"}
        else:
            assert (got.weight_version, got.num_replicas) == (3, 1), got
            assert await served(v3, 3) == alone
        print(f"v3 served, {got.num_replicas} replicas in rotation", flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(scenario(sys.argv[1]), SCENARIO_TIMEOUT_S))
    print("scenario passed", flush=True)
