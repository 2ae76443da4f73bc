"""Two hf replicas behind one service; a broadcast update whose sender is killed midway.

Done-when of issue 12 for the pool: every replica still serves the previous version
(same version, logprobs of the previous weights on both replicas), and the next update
lands on both. Runs in a fresh interpreter, as `test_pool.py` does (Ray's processes go
with the scenario's session).
"""

from __future__ import annotations

import asyncio
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


@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 90)
def test_pool_update_killed_mid_transfer_keeps_every_replica_on_the_previous_version() -> None:
    run_scenario(__file__, timeout_s=SCENARIO_TIMEOUT_S)


async def scenario() -> None:
    import grpc
    from grpc import aio
    from rlfleet_core.models import resolve_model
    from weight_testlib import (
        HF_POOL,
        Reference,
        Sender,
        assert_served_on,
        gloo_update_request,
        greedy_samples,
        noisy_weights,
        polled_status,
        rollout_stub,
        stream_weights,
    )

    model_path = resolve_model("tiny")
    reference = Reference(model_path, PROMPT)

    overrides = [*HF_POOL, "ray_call_timeout_s=30", "update_timeout_s=90"]
    async with rollout_stub(overrides) as stub:

        async def both_replicas() -> list[Any]:
            results = await greedy_samples(stub, PROMPT, calls=4)
            assert {r.replica for r in results} == {"hf-0", "hf-1"}
            return results

        previous = noisy_weights(reference.base, 1)
        assert (await stream_weights(stub, 1, previous, timeout_s=120)).weight_version == 1
        assert_served_on(await both_replicas(), reference, previous, 1)
        print("v1 served by both replicas", flush=True)

        with Sender(
            world_size=3,
            bucket_bytes=BUCKET_BYTES,
            group_timeout_s=GROUP_TIMEOUT_S,
            model_path=model_path,
        ) as sender:
            joined = await sender.engine_joins(stub, deadline_s=GROUP_TIMEOUT_S + 30)
            assert joined.num_workers == 2
            update = asyncio.ensure_future(
                stub.UpdateWeights(gloo_update_request(2, previous, BUCKET_BYTES), timeout=150)
            )
            await sender.said("half", 60)
            sender.kill()
            try:
                await update
                raise AssertionError("an update whose sender died was accepted")
            except aio.AioRpcError as exc:
                print(f"killed update: {exc.code()} {exc.details()}", flush=True)
                refused = exc

        status = await polled_status(stub)
        assert status.weight_version == 1 and status.num_replicas == 2
        assert_served_on(await both_replicas(), reference, previous, 1)
        assert refused.code() == grpc.StatusCode.ABORTED, refused.details()
        print("v1 still served by both replicas", flush=True)

        nxt = noisy_weights(reference.base, 3)
        assert (await stream_weights(stub, 2, nxt, timeout_s=120)).weight_version == 2
        assert_served_on(await both_replicas(), reference, nxt, 2)
        print("v2 served by both replicas", flush=True)


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(scenario(), SCENARIO_TIMEOUT_S))
    print("scenario passed", flush=True)
