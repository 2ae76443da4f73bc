"""What build a service is: its package version, the rlfleet-proto version it speaks and the
git commit its code came from. Every service reports this in `rlfleet.v1.BuildService`
(registered by the bootstrap), on HTTP `GET /version`, and rollout and trainer also in
their GetStatus; docs/upgrades.md says which versions work together."""

from __future__ import annotations

import functools
import os
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from grpc import aio
from rlfleet_proto.v1 import common_pb2, common_pb2_grpc

GIT_COMMIT_ENV = "RLFLEET_GIT_COMMIT"
"""Set by image builds (no .git inside an image); wins over asking git."""

BUILD_SERVICE = common_pb2.DESCRIPTOR.services_by_name["BuildService"].full_name


def package_version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


@functools.cache
def git_commit() -> str:
    """The commit of the checkout this code runs from: $RLFLEET_GIT_COMMIT, else
    `git rev-parse HEAD` next to this file when that is an rlfleet checkout, else ""
    (unknown: an installed wheel, even inside some other repository, or `git archive`)."""
    if commit := os.environ.get(GIT_COMMIT_ENV, "").strip():
        return commit
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = found.stdout.split()
    if found.returncode != 0 or len(lines) != 2:
        return ""
    ours = (Path(lines[0]) / "protos/rlfleet/v1/common.proto").is_file()
    return lines[1] if ours else ""


def build_info(service: str, package: str) -> common_pb2.BuildInfo:
    return common_pb2.BuildInfo(
        service=service,
        package=package,
        version=package_version(package),
        proto_version=package_version("rlfleet-proto"),
        git_commit=git_commit(),
    )


def build_dict(service: str, package: str) -> dict[str, str]:
    """`build_info` as JSON-ready fields (HTTP `/version`)."""
    info = build_info(service, package)
    return {f.name: str(getattr(info, f.name)) for f in info.DESCRIPTOR.fields}


class BuildServicer(common_pb2_grpc.BuildServiceServicer):
    def __init__(self, service: str, package: str) -> None:
        self.info = build_info(service, package)

    async def GetBuildInfo(
        self, request: common_pb2.GetBuildInfoRequest, context: aio.ServicerContext[Any, Any]
    ) -> common_pb2.BuildInfo:
        return self.info


def remote_build(target: str, timeout_s: float = 5.0) -> common_pb2.BuildInfo | None:
    """Ask the service at `target` what build it is. A 0.1 service has no BuildService:
    then its GetStatus answers (rollout and trainer carried BuildInfo there since 0.1);
    None when neither says (a 0.1 reward, sandbox or swe-runner). Other errors raise."""
    import grpc
    from rlfleet_proto.v1 import rollout_pb2, rollout_pb2_grpc, trainer_pb2, trainer_pb2_grpc

    from rlfleet_core.client import connect_sync

    with connect_sync(target, default_timeout_s=timeout_s, retry=None) as channel:

        def build_service() -> common_pb2.BuildInfo:
            request = common_pb2.GetBuildInfoRequest()
            return common_pb2_grpc.BuildServiceStub(channel).GetBuildInfo(
                request, timeout=timeout_s
            )

        def rollout_status() -> common_pb2.BuildInfo:
            stub = rollout_pb2_grpc.RolloutServiceStub(channel)
            return stub.GetStatus(rollout_pb2.GetStatusRequest(), timeout=timeout_s).build

        def trainer_status() -> common_pb2.BuildInfo:
            stub = trainer_pb2_grpc.TrainerServiceStub(channel)
            return stub.GetStatus(trainer_pb2.GetTrainerStatusRequest(), timeout=timeout_s).build

        for ask in (build_service, rollout_status, trainer_status):
            try:
                return ask()
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
    return None
