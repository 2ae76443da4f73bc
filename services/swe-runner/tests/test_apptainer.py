"""The apptainer backend: its exact command line, and `Evaluate` end to end under
fake_apptainer.py (Apptainer cannot be installed here), which accepts only that command
line and runs it with docker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.backends import ApptainerBackend, Limits
from rlfleet_swe.config import EvalConfig
from rlfleet_swe.images import Built
from swe_testlib import SMALL, instances, labelled, request_for, swe_stub

FAKE = Path(__file__).resolve().parent / "fake_apptainer.py"
INSTANCES = {i.instance_id: i for i in instances()}


def test_generated_command() -> None:
    backend = ApptainerBackend(EvalConfig(backend="apptainer", apptainer="/opt/bin/apptainer"))
    limits = Limits(memory_bytes=1 << 30, cpus=2, pids=256)
    command = backend.command("", "/images/x.sif", "/testbed", limits, ["python3", "-c", "x"])
    assert command == [
        "/opt/bin/apptainer", "exec", "--containall", "--writable-tmpfs", "--cleanenv",
        "--net", "--network", "none",
        "--memory", "1073741824", "--memory-swap", "1073741824",
        "--cpus", "2", "--pids-limit", "256",
        "--pwd", "/testbed", "/images/x.sif", "python3", "-c", "x",
    ]  # fmt: skip


@pytest.fixture
async def apptainer_stub(
    images: list[Built], runner_label: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[swe_pb2_grpc.SweRunnerServiceStub]:
    monkeypatch.setenv("FAKE_APPTAINER_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("FAKE_APPTAINER_LABEL", runner_label)
    overrides = [*SMALL, "eval.backend=apptainer", f"eval.apptainer={FAKE}",
                 "eval.kill_grace_s=20"]  # fmt: skip
    async with swe_stub(overrides, runner_label) as stub:
        yield stub


def sif_for(tmp_path: Path, image: str) -> str:
    """A `.sif` stand-in: fake_apptainer.py reads the docker image's name from it."""
    path = tmp_path / (image.replace("/", "_").replace(":", "_") + ".sif")
    path.write_text(image)
    return str(path)


@pytest.mark.parametrize("instance_id", sorted(INSTANCES))
async def test_gold_and_empty_under_fake_apptainer(
    apptainer_stub: swe_pb2_grpc.SweRunnerServiceStub, instance_id: str, tmp_path: Path
) -> None:
    instance = INSTANCES[instance_id]
    sif = sif_for(tmp_path, instance.image)
    gold = await apptainer_stub.Evaluate(request_for(instance, instance.patch, image=sif),
                                         timeout=180)  # fmt: skip
    assert gold.status == swe_pb2.EVAL_STATUS_COMPLETED, gold.log_tail
    assert gold.resolved
    empty = await apptainer_stub.Evaluate(request_for(instance, "", image=sif), timeout=180)
    assert empty.status == swe_pb2.EVAL_STATUS_COMPLETED, empty.log_tail
    assert not empty.resolved
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2
    assert all(call[:3] == ["exec", "--containall", "--writable-tmpfs"] for call in calls)
    assert all(sif in call and "--pids-limit" in call for call in calls)


async def test_watchdog_under_fake_apptainer(
    apptainer_stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    instance = INSTANCES["rlfleet__tinystats-1"]
    request = request_for(
        instance, "", image=sif_for(tmp_path, instance.image), test_command="sleep 600",
        timeout_s=3,
    )  # fmt: skip
    result = await apptainer_stub.Evaluate(request, timeout=60)
    assert result.status == swe_pb2.EVAL_STATUS_TIMEOUT
    # apptainer_stub checks on exit that the SIGTERM removed the container.


async def test_missing_sif_is_an_infra_error(
    apptainer_stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path
) -> None:
    request = request_for(INSTANCES["rlfleet__tinystats-1"], "", image=str(tmp_path / "no.sif"))
    result = await apptainer_stub.Evaluate(request, timeout=60)
    assert result.status == swe_pb2.EVAL_STATUS_INFRA_ERROR
    assert "could not open image" in result.log_tail


async def test_relative_image_is_refused(apptainer_stub: swe_pb2_grpc.SweRunnerServiceStub) -> None:
    request = request_for(INSTANCES["rlfleet__tinystats-1"], "", image="images/x.sif")
    with pytest.raises(aio.AioRpcError) as info:
        await apptainer_stub.Evaluate(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith("image:")


async def test_agent_session_under_fake_apptainer(
    apptainer_stub: swe_pb2_grpc.SweRunnerServiceStub, tmp_path: Path, runner_label: str
) -> None:
    instance = INSTANCES["rlfleet__tinystats-1"]
    key = (("x-rlfleet-client-key", "a" * 24),)
    opened = await apptainer_stub.OpenSweSession(
        swe_pb2.SweOpenSessionRequest(image=sif_for(tmp_path, instance.image),
                                      workdir=instance.workdir, base_commit=instance.base_commit),
        metadata=key, timeout=60,
    )  # fmt: skip
    assert len(labelled(runner_label)) == 1

    async def run(**fields: object) -> swe_pb2.SweRunToolReply:
        request = swe_pb2.SweRunToolRequest(session_id=opened.session_id, **fields)  # type: ignore[arg-type]
        return await apptainer_stub.RunSweTool(request, metadata=key, timeout=60)

    assert (await run(tool=swe_pb2.SWE_TOOL_BASH, command="pwd")).output.strip() == "/testbed"
    edited = await run(tool=swe_pb2.SWE_TOOL_EDIT, path="tinystats/core.py",
                       old_str="max(values) - min(values)", new_str="max(values) - min(values) + 0")  # fmt: skip
    assert not edited.error, edited.output
    submitted = await run(tool=swe_pb2.SWE_TOOL_SUBMIT)
    assert "+    return max(values) - min(values) + 0" in submitted.patch
    await apptainer_stub.CloseSweSession(
        swe_pb2.SweCloseSessionRequest(session_id=opened.session_id), metadata=key, timeout=60
    )
    assert labelled(runner_label) == []
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls[0][:-1] == [
        "instance", "start", "--containall", "--writable-tmpfs", "--cleanenv",
        "--net", "--network", "none", "--memory", "268435456", "--memory-swap", "268435456",
        "--cpus", "1", "--pids-limit", "64", sif_for(tmp_path, instance.image),
    ]  # fmt: skip
    assert calls[-1][:2] == ["instance", "stop"]
    assert all(call[3].startswith("instance://") for call in calls[1:-1])
