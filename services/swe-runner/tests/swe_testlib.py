"""Helpers of the swe-runner tests (conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from rlfleet_core.client import connect
from rlfleet_core.testing import running_service
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.images import bundled_instances_dir
from rlfleet_swe.instances import SweInstance, load_instances
from rlfleet_swe.service import SERVICE

SMALL = [
    "eval.test_timeout_s=120",
    "eval.memory_bytes=268435456",
    "eval.cpus=1",
    "eval.pids_limit=64",
    "eval.docker_call_timeout_s=30",
]


def runner_overrides(runner_label: str, *more: str) -> list[str]:
    """The SMALL limits, the test's own runner label (its containers' label), and `more`."""
    return [*SMALL, f"eval.runner_label={runner_label}", *more]


@asynccontextmanager
async def swe_stub(
    overrides: list[str], runner_label: str
) -> AsyncIterator[swe_pb2_grpc.SweRunnerServiceStub]:
    """The service started with `overrides`, and a stub on it; once it stopped, no
    container labelled `runner_label` may be left."""
    async with (
        running_service(SERVICE, overrides) as running,
        connect(f"127.0.0.1:{running.grpc_port}") as channel,
    ):
        yield swe_pb2_grpc.SweRunnerServiceStub(channel)
    assert labelled(runner_label) == [], "containers left behind"


def instances() -> list[SweInstance]:
    return load_instances(bundled_instances_dir() / "instances.jsonl")


def labelled(label: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=rlfleet.swe.runner={label}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.split()


def request_for(instance: SweInstance, patch: str, **overrides: object) -> swe_pb2.EvaluateRequest:
    fields: dict[str, object] = {
        "instance_id": instance.instance_id,
        "image": instance.image,
        "workdir": instance.workdir,
        "patch": patch,
        "test_patch": instance.test_patch,
        "test_command": instance.test_command,
        "fail_to_pass": instance.fail_to_pass,
        "pass_to_pass": instance.pass_to_pass,
        "timeout_s": 120,
    }
    fields.update(overrides)
    return swe_pb2.EvaluateRequest(**fields)  # type: ignore[arg-type]


def host_checkout(instance: SweInstance, tmp: Path) -> Path:
    """The instance's repository at base_commit on the host (to write patches against)."""
    tmp.mkdir(parents=True, exist_ok=True)
    snapshot = bundled_instances_dir() / "repos" / f"{instance.instance_id}.patch"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for args in (["init", "-q"], ["apply", str(snapshot)], ["add", "-A"],
                 ["-c", "commit.gpgsign=false", "commit", "-q", "-m", "base"]):  # fmt: skip
        subprocess.run(["git", *args], cwd=tmp, env=env, check=True, timeout=30)
    return tmp


def diff_of(repo: Path, edits: dict[str, tuple[str, str]], patch: str = "") -> str:
    """`patch` applied, then each file's (old -> new) text replacement, as one diff."""
    if patch:
        subprocess.run(["git", "apply", "-"], input=patch.encode(), cwd=repo, check=True,
                       timeout=30)  # fmt: skip
    for name, (old, new) in edits.items():
        path = repo / name
        text = path.read_text()
        assert old in text, (name, old)
        path.write_text(text.replace(old, new))
    done = subprocess.run(["git", "diff"], cwd=repo, capture_output=True, text=True,
                          check=True, timeout=30)  # fmt: skip
    return done.stdout
