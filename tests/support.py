"""Helpers for the cross-service tests: real processes on loopback ports."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlfleet_core.ports import BoundPorts, PortFileError, wait_for_port_file

REPO = Path(__file__).resolve().parents[1]
RLFLEET = str(Path(sys.executable).parent / "rlfleet")


def run_rlfleet(cwd: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`rlfleet ARGS` in `cwd` as a user runs it (wide output, no warnings), captured."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "rlfleet_cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def spawn_bound(
    command: list[str], port_file: Path, timeout_s: float = 180, **popen: Any
) -> tuple[subprocess.Popen[Any], BoundPorts]:
    """Start a service `command` (`python -m rlfleet_<svc>` or `rlfleet serve <svc>`, with
    its flags) on ports it binds itself (`--port 0 --port-file`; add `--http-port 0` to
    `command` for an HTTP face); returns once it reported them. Never picks a port
    number for the child to bind: another process could take it first."""
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen([*command, "--port", "0", "--port-file", str(port_file)], **popen)
    try:
        return process, wait_for_port_file(port_file, process, timeout_s)
    except PortFileError as exc:
        process.kill()
        process.wait(10)
        pytest.fail(f"{' '.join(command[:4])}: {exc}", pytrace=False)


def start_service(
    module: str,
    args: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    *,
    port_file: bool = True,
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m module --port 0 args…` on loopback (`env` added to the environment), its
    output in `log`; returns once its gRPC health check says SERVING (fails the test with
    the log's tail otherwise). `ports_of(process)` gives its ports (HTTP with
    `--http-port 0` in `args`). `port_file=False`: a release from before `--port-file`
    (0.1.0) gets a port picked here (racy, `pick_free_port`) with `--port N`."""
    import grpc
    from rlfleet_core.client import check_health
    from rlfleet_core.ports import pick_free_port

    popen: dict[str, Any] = dict(
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONWARNINGS": "ignore::SyntaxWarning", **(env or {})},
    )
    if port_file:
        process, ports = spawn_bound(
            [sys.executable, "-m", module, *args], log.with_suffix(".ports.json"), **popen
        )
        _ports[process.pid] = ports
        port = ports.grpc
    else:
        port = pick_free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", module, "--port", str(port), *args], **popen
        )
    target = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{module} exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if check_health(target, timeout_s=1.0) == "SERVING":
                return process, target
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    process.kill()
    pytest.fail(f"{module} not SERVING after 120 s: {log.read_text()[-2000:]}")


_ports: dict[int, BoundPorts] = {}


def ports_of(process: subprocess.Popen[bytes]) -> BoundPorts:
    """The ports a service started by `start_service` bound."""
    return _ports[process.pid]


def stop_service(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


# --- containers (tests/test_containers.py, tests/test_compose.py) ---------------------------

REQUIRE_DOCKER = "RLFLEET_REQUIRE_DOCKER"
"""Set to 1 (as .ci/run does) to make container tests fail, not skip, without Docker."""

_image_build_s: dict[str, float] = {}


@functools.cache
def _docker_problem(compose: bool) -> str | None:
    if shutil.which("docker") is None:
        return "no `docker` CLI on PATH"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        return f"`docker info` failed: {(info.stderr or info.stdout).strip()[-400:]}"
    if compose:
        version = subprocess.run(
            ["docker", "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if version.returncode != 0:
            return (
                "the Docker Compose v2 plugin is missing (deploy/compose/install-compose.sh): "
                f"{(version.stderr or version.stdout).strip()[-300:]}"
            )
    return None


def require_docker(*, compose: bool = False) -> None:
    """Skip the calling test when no Docker engine answers, or fail when
    RLFLEET_REQUIRE_DOCKER=1 (CI), naming what is missing."""
    problem = _docker_problem(compose)
    if problem is None:
        return
    message = (
        f"no usable Docker engine ({problem.rstrip('.?')}); start one as docs/containers.md "
        f"says (apt-get install docker.io; dockerd --ip 127.0.0.1 &)"
    )
    if os.environ.get(REQUIRE_DOCKER) == "1":
        pytest.fail(f"{message} — and {REQUIRE_DOCKER}=1 makes this a failure", pytrace=False)
    pytest.skip(message)


def image_exists(image: str) -> bool:
    return (
        subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
    )


@contextlib.contextmanager
def _image_build_lock() -> Iterator[None]:
    """Held while building images: two workers building the same image (and the base image
    it needs) at once would do the work twice and race on the tag; the second one finds
    Docker's layer cache warm instead."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "rlfleet-image-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_base_image() -> None:
    """rlfleet/base:bookworm, built with deploy/docker/build-base.sh when missing (it
    returns at once when the image exists). Every image of the project starts from it;
    a test that needs it must not rely on an earlier test having built it: pytest-xdist
    runs the files in another order, and a fresh machine has none."""
    with _image_build_lock():
        done = subprocess.run(
            [str(REPO / "deploy/docker/build-base.sh")],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if done.returncode != 0:
        pytest.fail(
            f"deploy/docker/build-base.sh failed ({done.returncode}):\n"
            f"{(done.stdout + done.stderr).strip()[-3000:]}",
            pytrace=False,
        )


def swe_instance_images() -> list[Any]:
    """The bundled SWE instances' images (rlfleet_swe.images.build_images: cached by
    content), the base image first; one builder at a time across workers."""
    from rlfleet_swe.images import build_images

    ensure_base_image()
    with _image_build_lock():
        return build_images()


def ensure_images(*services: str) -> dict[str, float]:
    """Build rlfleet/<service>:latest from this checkout, once per test session, with
    `deploy/docker/build-images.sh <service>` (the base image too, when missing). Always
    built, never trusted as found: an image left by an older checkout would test old code.
    Docker's layer cache makes an unchanged rebuild take seconds. Returns the build time
    in seconds of each image; fails the test with the tail of the build log on failure."""
    for service in services:
        if service in _image_build_s:
            continue
        if shutil.which("uv") is None:
            pytest.fail(
                f"rlfleet/{service}:latest is missing and building it needs `uv` on PATH",
                pytrace=False,
            )
        command = [str(REPO / "deploy/docker/build-images.sh"), service]
        started = time.monotonic()
        with _image_build_lock():  # one build at a time across pytest-xdist workers
            build = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
        elapsed = time.monotonic() - started
        if build.returncode != 0 or not image_exists(f"rlfleet/{service}:latest"):
            log = (build.stdout + build.stderr).strip()[-3000:]
            pytest.fail(
                f"building image rlfleet/{service}:latest failed ({' '.join(command)}, "
                f"exit {build.returncode}, {elapsed:.0f} s):\n{log}",
                pytrace=False,
            )
        _image_build_s[service] = elapsed
        print(f"built rlfleet/{service}:latest in {elapsed:.0f} s")
    return dict(_image_build_s)


@contextlib.contextmanager
def sandbox_and_reward(
    tmp: Path, reward_args: list[str], sandbox_args: list[str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes], str]]:
    """The sandbox service (the test is skipped where it cannot run programs) and a reward
    gateway wired to it (`reward_args` added, logs in `tmp`); yields (sandbox target,
    reward process, reward target) and stops both."""
    import grpc
    from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc

    sandbox, sandbox_target = start_service(
        "rlfleet_sandbox", sandbox_args or [], tmp / "sandbox.log"
    )
    try:
        with grpc.insecure_channel(sandbox_target) as channel:
            probe = sandbox_pb2_grpc.SandboxServiceStub(channel).Execute(
                sandbox_pb2.ExecuteRequest(language=sandbox_pb2.LANGUAGE_PYTHON, code="print(1)"),
                timeout=30,
            )
        if probe.status == sandbox_pb2.EXEC_STATUS_SANDBOX_ERROR:
            pytest.skip(f"the sandbox cannot run programs on this machine: {probe.stderr[-300:]}")
        reward, reward_target = start_service(
            "rlfleet_reward", [*reward_args, f"sandbox.target={sandbox_target}"], tmp / "reward.log"
        )
        try:
            yield sandbox_target, reward, reward_target
        finally:
            stop_service(reward)
    finally:
        stop_service(sandbox)


# --- headless Chromium (tests/test_fleet_ui.py) --------------------------------------------

REQUIRE_CHROMIUM = "RLFLEET_REQUIRE_CHROMIUM"
"""Set to 1 (as .ci/run does) to make browser tests fail, not skip, without Chromium."""


def require_chromium() -> str:
    """The `chromium` executable; skips the calling test without one, or fails when
    RLFLEET_REQUIRE_CHROMIUM=1 (CI)."""
    found = shutil.which("chromium")
    if found is not None:
        return found
    message = "no `chromium` on PATH (apt-get install -y --no-install-recommends chromium)"
    if os.environ.get(REQUIRE_CHROMIUM) == "1":
        pytest.fail(f"{message} — and {REQUIRE_CHROMIUM}=1 makes this a failure", pytrace=False)
    pytest.skip(message)
