"""The swe-runner as `rlfleet serve swe-runner` (a real process, real docker): Evaluate
scores a bundled instance's gold patch, and stopping the process (SIGTERM) closes an open
agent session's container."""

from __future__ import annotations

import secrets
import signal
import subprocess
from pathlib import Path

import grpc
from rlfleet_proto.v1 import swe_pb2, swe_pb2_grpc
from rlfleet_swe.images import bundled_instances_dir
from rlfleet_swe.instances import load_instances
from support import RLFLEET, require_docker, spawn_bound, swe_instance_images


def _labelled(label: str) -> list[str]:
    done = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=rlfleet.swe.runner={label}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.split()


def test_serve_evaluate_and_stop(tmp_path: Path) -> None:
    require_docker()
    swe_instance_images()
    instance = load_instances(bundled_instances_dir() / "instances.jsonl")[0]
    label = f"swe-serve-{secrets.token_hex(4)}"
    proc, ports = spawn_bound(
        [RLFLEET, "serve", "swe-runner", f"eval.runner_label={label}", "eval.pids_limit=64",
         "eval.memory_bytes=268435456", "eval.cpus=1"],
        tmp_path / "ports.json", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
            stub = swe_pb2_grpc.SweRunnerServiceStub(channel)
            request = swe_pb2.EvaluateRequest(
                instance_id=instance.instance_id, image=instance.image, workdir=instance.workdir,
                patch=instance.patch, test_patch=instance.test_patch,
                test_command=instance.test_command, fail_to_pass=instance.fail_to_pass,
                pass_to_pass=instance.pass_to_pass, timeout_s=120,
            )  # fmt: skip
            result = stub.Evaluate(request, timeout=180)
            assert result.resolved, result.log_tail
            key = (("x-rlfleet-client-key", secrets.token_hex(16)),)
            stub.OpenSweSession(
                swe_pb2.SweOpenSessionRequest(image=instance.image, workdir=instance.workdir),
                metadata=key, timeout=60,
            )  # fmt: skip
            assert len(_labelled(label)) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert "Traceback" not in stderr
    assert _labelled(label) == []
