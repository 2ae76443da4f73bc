"""TEST DOUBLE of the sandbox service (rlfleet.v1.SandboxService), for the reward tests only.

A real gRPC server on loopback whose Execute runs the program with this Python in a
subprocess (no isolation at all: the real sandbox, services/sandbox, uses bubblewrap and
rlimits). It exists so that the reward gateway's sandbox client and `code` environment
are tested over real gRPC before the sandbox service lands; the cross-service test
against the real sandbox is still to be written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

import grpc
from rlfleet_proto.v1 import sandbox_pb2, sandbox_pb2_grpc


class SubprocessSandbox(sandbox_pb2_grpc.SandboxServiceServicer):
    def __init__(self) -> None:
        self.calls = 0

    def Execute(
        self, request: sandbox_pb2.ExecuteRequest, context: grpc.ServicerContext
    ) -> sandbox_pb2.ExecuteResult:
        self.calls += 1
        if request.language != sandbox_pb2.LANGUAGE_PYTHON:
            return sandbox_pb2.ExecuteResult(
                status=sandbox_pb2.EXEC_STATUS_SANDBOX_ERROR, stderr="double runs python only"
            )
        timeout_s = request.limits.timeout_s or 10.0
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "main.py"
            path.write_text(request.code)
            # Its own process group, killed whole afterwards: the code harness forks,
            # and a child that spins or ignores signals must not outlive the call.
            proc = subprocess.Popen(
                [sys.executable, "-I", str(path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=folder,
                start_new_session=True,
            )
            try:
                stdout, stderr = proc.communicate(request.stdin, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                stdout, _ = proc.communicate()
                return sandbox_pb2.ExecuteResult(
                    status=sandbox_pb2.EXEC_STATUS_TIMEOUT,
                    exit_code=-9,
                    signal=9,
                    stdout=stdout or "",
                    wall_time_s=time.perf_counter() - start,
                )
            finally:
                _kill_group(proc)
        status = (
            sandbox_pb2.EXEC_STATUS_OK if proc.returncode == 0 else sandbox_pb2.EXEC_STATUS_ERROR
        )
        return sandbox_pb2.ExecuteResult(
            status=status,
            stdout=stdout,
            stderr=stderr,
            exit_code=proc.returncode,
            wall_time_s=time.perf_counter() - start,
        )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def start_sandbox_double(workers: int = 8) -> tuple[grpc.Server, int, SubprocessSandbox]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    servicer = SubprocessSandbox()
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, servicer
