"""`Evaluate` on every bundled tiny instance through the real gRPC service and real docker:
the gold patch resolves it, an empty patch does not, a patch that fixes the bug but breaks
a PASS_TO_PASS test does not; plus patch failures, bad requests, the watchdog, cleanup and
the queue limit."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlfleet_core.client import connect
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.backends import process_owner
from rlfleet_swe.service import SERVICE
from swe_testlib import (
    diff_of,
    host_checkout,
    instances,
    labelled,
    request_for,
    runner_overrides,
    swe_stub,
)

INSTANCES = {instance.instance_id: instance for instance in instances()}
# For each instance, an edit (on top of the gold fix) that breaks a PASS_TO_PASS test.
BREAKS = {
    "rlfleet__tinystats-1": ("tinystats/core.py", ("max(values) - min(values)", "max(values)")),
    "rlfleet__slugkit-1": ("slugkit/text.py", ("text[: width - 1]", "text[:width]")),
    "rlfleet__intervals-1": ("intervals/ops.py", ("sum(end - start", "sum(end - start + 1")),
    "rlfleet__wordfreq-1": ("wordfreq/tokens.py", ('r"[A-Za-z]+"', 'r"[A-Za-z,]+"')),
}
PASSED = swe_pb2.TEST_OUTCOME_PASSED


def test_every_bundled_instance_has_a_break() -> None:
    assert set(BREAKS) == set(INSTANCES)


@pytest.mark.parametrize("instance_id", sorted(INSTANCES))
async def test_gold_empty_and_breaking_patches(
    stub: swe_pb2_grpc.SweRunnerServiceStub, instance_id: str, tmp_path: Path
) -> None:
    instance = INSTANCES[instance_id]
    gold = await stub.Evaluate(request_for(instance, instance.patch), timeout=180)
    assert gold.status == swe_pb2.EVAL_STATUS_COMPLETED, gold.log_tail
    assert gold.resolved, gold.log_tail
    required = {t.name: t.outcome for t in gold.tests if t.required}
    assert set(required) == {*instance.fail_to_pass, *instance.pass_to_pass}
    assert set(required.values()) == {PASSED}

    empty = await stub.Evaluate(request_for(instance, ""), timeout=180)
    assert empty.status == swe_pb2.EVAL_STATUS_COMPLETED, empty.log_tail
    assert not empty.resolved
    outcomes = {t.name: t.outcome for t in empty.tests}
    assert all(outcomes[name] == swe_pb2.TEST_OUTCOME_FAILED for name in instance.fail_to_pass)
    assert all(outcomes[name] == PASSED for name in instance.pass_to_pass)

    name, edit = BREAKS[instance_id]
    breaking = diff_of(host_checkout(instance, tmp_path), {name: edit}, instance.patch)
    broken = await stub.Evaluate(request_for(instance, breaking), timeout=180)
    assert broken.status == swe_pb2.EVAL_STATUS_COMPLETED, broken.log_tail
    assert not broken.resolved
    outcomes = {t.name: t.outcome for t in broken.tests}
    assert all(outcomes[name] == PASSED for name in instance.fail_to_pass)
    assert any(outcomes[name] != PASSED for name in instance.pass_to_pass)


async def test_patch_that_does_not_apply(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    instance = INSTANCES["rlfleet__tinystats-1"]
    bad = instance.patch.replace("ordered = sorted(values)", "ordered = sorted(values, x)")
    result = await stub.Evaluate(request_for(instance, bad), timeout=180)
    assert result.status == swe_pb2.EVAL_STATUS_PATCH_FAILED, result.log_tail
    assert not result.resolved and "patch does not apply" in result.error
    garbage = await stub.Evaluate(request_for(instance, "not a diff\n"), timeout=180)
    assert garbage.status == swe_pb2.EVAL_STATUS_PATCH_FAILED


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("instance_id", ""),
        ("image", ""),
        ("image", "-rm"),
        ("image", "/images/x.sif"),
        ("workdir", "relative"),
        ("test_command", " "),
        ("fail_to_pass", []),
        ("timeout_s", -1.0),
        ("timeout_s", float("nan")),
        ("timeout_s", 1e9),
        ("memory_bytes", 1000),
        ("test_patch", "BIG"),
    ],
)
async def test_bad_requests_name_the_field(
    stub: swe_pb2_grpc.SweRunnerServiceStub, field: str, value: object
) -> None:
    if value == "BIG":
        value = "x" * (5 << 20)
    request = request_for(INSTANCES["rlfleet__tinystats-1"], "", **{field: value})
    with pytest.raises(aio.AioRpcError) as info:
        await stub.Evaluate(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(f"{field}:")


async def test_watchdog_kills_at_the_deadline(
    stub: swe_pb2_grpc.SweRunnerServiceStub, runner_label: str
) -> None:
    instance = INSTANCES["rlfleet__tinystats-1"]
    request = request_for(instance, "", test_command="sleep 600", timeout_s=3)
    result = await stub.Evaluate(request, timeout=60)
    assert result.status == swe_pb2.EVAL_STATUS_TIMEOUT
    assert not result.resolved
    assert labelled(runner_label) == []


async def test_missing_image_is_an_infra_error(stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    request = request_for(INSTANCES["rlfleet__tinystats-1"], "", image="rlfleet/no-such:image")
    result = await stub.Evaluate(request, timeout=60)
    assert result.status == swe_pb2.EVAL_STATUS_INFRA_ERROR
    assert "No such image" in result.log_tail or "pull access denied" in result.log_tail


async def test_stale_containers_are_removed_at_start(images: object, runner_label: str) -> None:
    """A leftover of a runner that is gone (its pid now another process's)."""
    image = INSTANCES["rlfleet__tinystats-1"].image
    host, boot, pid, _ = process_owner().split("/")
    subprocess.run(
        ["docker", "run", "-d", "--rm", "--label", f"rlfleet.swe.runner={runner_label}",
         "--label", f"rlfleet.swe.owner={host}/{boot}/{pid}/1",
         "--network", "none", image, "sleep", "600"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    assert len(labelled(runner_label)) == 1
    async with running_service(SERVICE, runner_overrides(runner_label)):
        assert labelled(runner_label) == []


def one_at_a_time(runner_label: str) -> list[str]:
    """One evaluation at a time, one more queued behind it."""
    return runner_overrides(runner_label, "eval.max_concurrent=1", "eval.max_queued=1")


async def test_full_queue_is_resource_exhausted(images: object, runner_label: str) -> None:
    instance = INSTANCES["rlfleet__tinystats-1"]
    slow = request_for(instance, "", test_command="sleep 600", timeout_s=8)
    async with swe_stub(one_at_a_time(runner_label), runner_label) as stub:

        async def call() -> swe_pb2.EvaluateResult:
            return await stub.Evaluate(slow, timeout=60)

        first = asyncio.create_task(call())
        await asyncio.sleep(1.0)
        second = asyncio.create_task(call())
        await asyncio.sleep(1.0)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.Evaluate(slow, timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "eval.max_queued" in (info.value.details() or "")
        results = await asyncio.gather(first, second)
        assert [r.status for r in results] == [swe_pb2.EVAL_STATUS_TIMEOUT] * 2


async def test_health_is_serving(images: object, runner_label: str) -> None:
    async with (
        running_service(SERVICE, runner_overrides(runner_label)) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.SweRunnerService"), timeout=10
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_queued_call_past_its_deadline_leaves_the_queue(
    images: object, runner_label: str
) -> None:
    instance = INSTANCES["rlfleet__tinystats-1"]
    slow = request_for(instance, "", test_command="sleep 600", timeout_s=6)
    async with swe_stub(one_at_a_time(runner_label), runner_label) as stub:

        async def call(deadline: float) -> swe_pb2.EvaluateResult:
            return await stub.Evaluate(slow, timeout=deadline)

        first = asyncio.create_task(call(60))
        await asyncio.sleep(1.0)
        with pytest.raises(aio.AioRpcError) as info:
            await call(1.0)  # queued behind `first` until its deadline
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(0.5)
        second = asyncio.create_task(call(60))  # the queue has room again
        results = await asyncio.gather(first, second)
        assert [r.status for r in results] == [swe_pb2.EVAL_STATUS_TIMEOUT] * 2


async def test_without_a_docker_cli_the_service_serves_and_says_so(runner_label: str) -> None:
    overrides = runner_overrides(runner_label, "eval.docker=/nonexistent/docker")
    instance = INSTANCES["rlfleet__tinystats-1"]
    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rlfleet.v1.SweRunnerService"), timeout=10
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = swe_pb2_grpc.SweRunnerServiceStub(channel)
        result = await stub.Evaluate(request_for(instance, instance.patch), timeout=30)
        assert result.status == swe_pb2.EVAL_STATUS_INFRA_ERROR
        assert "/nonexistent/docker" in result.log_tail
        opening = swe_pb2.SweOpenSessionRequest(image=instance.image, workdir=instance.workdir)
        with pytest.raises(aio.AioRpcError) as info:
            await stub.OpenSweSession(
                opening, metadata=(("x-rlfleet-client-key", "k" * 20),), timeout=30
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "eval.docker" in (info.value.details() or "")
