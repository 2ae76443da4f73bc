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


async def late_broadcast(stub: Any, model_path: Any, shapes_of: Any) -> None:
    """Version 2 by broadcast (tensors shaped as `shapes_of`); the sender stalls after half
    the buckets until the pool has given up (ABORTED), then sends the rest, so the
    replicas load it late."""
    import grpc
    from grpc import aio
    from weight_testlib import Sender, gloo_update_request

    with Sender(
        world_size=3,
        bucket_bytes=BUCKET_BYTES,
        group_timeout_s=GROUP_TIMEOUT_S,
        model_path=model_path,
        then="finish",
    ) as sender:
        joined = await sender.engine_joins(stub, deadline_s=120)
        assert joined.num_workers == 2
        start = time.monotonic()
        with pytest.raises(aio.AioRpcError) as info:
            await stub.UpdateWeights(
                gloo_update_request(2, shapes_of, BUCKET_BYTES),
                timeout=UPDATE_TIMEOUT_S + RAY_CALL_TIMEOUT_S + 60,
            )
        print(
            f"stalled update: {time.monotonic() - start:.1f}s, {info.value.details()}", flush=True
        )
        assert info.value.code() == grpc.StatusCode.ABORTED, info.value.details()
        await sender.said("half", 10)
        sender.go()
        await sender.said("done", 60)
    await asyncio.sleep(3)  # the replicas' receive threads copy version 2 in


async def scenario(mode: str) -> None:
    import grpc
    from grpc import aio
    from rlfleet_core.models import resolve_model
    from weight_testlib import (
        HF_POOL,
        Reference,
        assert_served_on,
        greedy_samples,
        noisy_weights,
        polled_status,
        rollout_stub,
        stream_weights,
    )

    model_path = resolve_model("tiny")
    reference = Reference(model_path, PROMPT)

    def noisy(seed: int) -> dict[str, Any]:
        return noisy_weights(reference.base, seed)

    overrides = [
        *HF_POOL,
        f"ray_call_timeout_s={RAY_CALL_TIMEOUT_S:g}",
        f"update_timeout_s={UPDATE_TIMEOUT_S:g}",
    ]
    async with rollout_stub(overrides) as stub:

        async def served(weights: dict[str, Any], version: int) -> set[str]:
            """Concurrent Generates: every sample on `version`, with `weights`' logprobs.
            Returns the replicas that served them."""
            results = await greedy_samples(stub, PROMPT, calls=REQUESTS, timeout_s=120)
            assert len(results) == 2 * REQUESTS
            assert_served_on(results, reference, weights, version)
            return {r.replica for r in results}

        v1 = noisy(1)
        assert (await stream_weights(stub, 1, v1, timeout_s=120)).weight_version == 1
        assert await served(v1, 1) == {"hf-0", "hf-1"}
        if mode == "late":
            await late_broadcast(stub, model_path, v1)
            # Out of rotation until an update lands: no sample on any version.
            with pytest.raises(aio.AioRpcError) as info:
                await served(v1, 1)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
            got = await polled_status(stub)
            assert (got.weight_version, got.num_replicas) == (1, 0), got
            v3 = noisy(3)
            assert (await stream_weights(stub, 3, v3, timeout_s=120)).weight_version == 3
            got = await polled_status(stub)
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
            reply = await stream_weights(stub, 2, v2, timeout_s=deadline)
            print(f"update with one replica {mode}: {time.monotonic() - start:.1f}s", flush=True)
            assert reply.weight_version == 2
            got = await polled_status(stub)
            assert (got.weight_version, got.num_replicas) == (2, 1), got
            alone = await served(v2, 2)
            assert len(alone) == 1, alone
            print(f"v2 served by {alone} only", flush=True)
        finally:
            if mode == "deadline":
                os.kill(victim, signal.SIGCONT)

        v3 = noisy(3)
        assert (await stream_weights(stub, 3, v3, timeout_s=deadline)).weight_version == 3
        got = await polled_status(stub)
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
