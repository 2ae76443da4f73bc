"""The swe-runner image (rlfleet/swe-runner:latest) under the host's Docker engine, as
compose.yaml runs it: the image carries a docker CLI, and with the engine's socket mounted
the service starts instance containers: Evaluate of a bundled instance's gold patch
resolves it (a container started by the containerised service, through the host engine),
and nothing of it is left behind. Without a Docker engine the tests skip, or fail when
RLFLEET_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from rlfleet_core.auth import TOKEN_ENV, generate_token
from rlfleet_core.client import check_health, connect_sync
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from support import ensure_images, require_docker, swe_instance_images

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

IMAGE = "rlfleet/swe-runner:latest"
SOCKET = "/var/run/docker.sock"
TOKEN = generate_token()


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> str:
    require_docker()
    ensure_images("swe-runner")
    return IMAGE


def test_the_image_has_a_docker_cli_that_reaches_the_mounted_engine(image: str) -> None:
    host = _docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    inside = _docker("run", "--rm", "-v", f"{SOCKET}:{SOCKET}", "--entrypoint", "docker", image,
                     "version", "--format", "{{.Server.Version}}")  # fmt: skip
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() == host and host
    alone = _docker("run", "--rm", "--entrypoint", "docker", image, "version")
    assert alone.returncode != 0 and "Cannot connect to the Docker daemon" in alone.stderr


@pytest.fixture(scope="module")
def runner(image: str) -> Iterator[tuple[str, str]]:
    """The service in its image, socket mounted; yields (gRPC target, runner label)."""
    swe_instance_images()  # the bundled instances' images, on the host engine
    label = f"swe-image-test-{generate_token()[:8]}".replace("_", "-")
    started = _docker(
        "run", "-d", "--rm", "-e", f"{TOKEN_ENV}={TOKEN}", "-v", f"{SOCKET}:{SOCKET}",
        "-p", "127.0.0.1::50051", image, "rlfleet-swe", "--host", "0.0.0.0", "--port", "50051",
        f"eval.runner_label={label}", "eval.memory_bytes=268435456", "eval.cpus=1",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        port = _docker("port", container, "50051").stdout.split()[0].rsplit(":", 1)[1]
        target = f"127.0.0.1:{port}"
        deadline, state = time.monotonic() + 120, "no answer"
        while time.monotonic() < deadline and state != "SERVING":
            try:
                state = check_health(target, timeout_s=2.0)
            except grpc.RpcError as exc:
                state = exc.code().name
                time.sleep(0.5)
        logs = _docker("logs", container)
        assert state == "SERVING", logs.stdout + logs.stderr
        yield target, label
    finally:
        _docker("rm", "-f", container)


def test_the_containerised_service_evaluates_through_the_host_engine(
    runner: tuple[str, str],
) -> None:
    from rlfleet_swe.images import bundled_instances_dir
    from rlfleet_swe.instances import load_instances

    target, label = runner
    instance = load_instances(bundled_instances_dir() / "instances.jsonl")[0]
    request = swe_pb2.EvaluateRequest(
        instance_id=instance.instance_id, image=instance.image, workdir=instance.workdir,
        patch=instance.patch, test_patch=instance.test_patch,
        test_command=instance.test_command, fail_to_pass=instance.fail_to_pass,
        pass_to_pass=instance.pass_to_pass, timeout_s=120,
    )  # fmt: skip
    with connect_sync(target, auth_token=TOKEN) as channel:
        stub = swe_pb2_grpc.SweRunnerServiceStub(channel)
        result = stub.Evaluate(request, timeout=240)
    assert result.status == swe_pb2.EVAL_STATUS_COMPLETED, (result.error, result.log_tail)
    assert result.resolved, result.log_tail
    left = _docker("ps", "-aq", "--filter", f"label=rlfleet.swe.runner={label}")
    assert left.stdout.split() == []
