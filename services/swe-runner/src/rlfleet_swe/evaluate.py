"""`Evaluate`: one fresh container per call; apply the patch and the test patch, run the
tests, score FAIL_TO_PASS / PASS_TO_PASS. At most `max_concurrent` calls run at once and
`max_queued` wait; a call beyond that is RESOURCE_EXHAUSTED."""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
import time

from rlfleet_core.errors import InvalidArgument, ResourceExhausted
from rlfleet_proto.v1 import swe_pb2

from rlfleet_swe.backends import Backend, Limits
from rlfleet_swe.config import EvalConfig
from rlfleet_swe.driver import DRIVER, MARKER, REPORT_PLUGIN
from rlfleet_swe.results import (
    IMPORT_MACHINERY,
    decode_refusal,
    parse_report,
    score,
    touches_test_machinery,
)

_INSTANCE_ID = re.compile(r"^[A-Za-z0-9_.:/+-]{1,256}$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,511}$")
_SIF = re.compile(r"^/[^\x00-\x1f]{1,4095}$")


class Admission:
    """A slot limit with a bounded queue."""

    def __init__(self, slots: int, max_queued: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self._max_queued = max_queued
        self.queued = 0

    async def __aenter__(self) -> None:
        if self._slots.locked() and self.queued >= self._max_queued:
            raise ResourceExhausted(
                f"swe-runner is busy: {self.queued} calls already queued (eval.max_queued)"
            )
        self.queued += 1
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1

    async def __aexit__(self, *exc: object) -> None:
        self._slots.release()


def _check(request: swe_pb2.EvaluateRequest, config: EvalConfig) -> tuple[float, int]:
    if not _INSTANCE_ID.match(request.instance_id):
        raise InvalidArgument("instance_id", f"use 1-256 of A-Z a-z 0-9 _ . : / + -, got "
                              f"{request.instance_id[:80]!r}")  # fmt: skip
    if config.backend == "apptainer":
        if not _SIF.match(request.image):
            raise InvalidArgument("image", f"the apptainer backend needs an absolute .sif path, "
                                  f"got {request.image[:80]!r}")  # fmt: skip
    elif not _IMAGE.match(request.image):
        raise InvalidArgument("image", f"must be a docker image name, got "
                              f"{request.image[:80]!r}")  # fmt: skip
    if not request.workdir.startswith("/") or "\x00" in request.workdir:
        raise InvalidArgument("workdir", f"must be an absolute path, got {request.workdir!r}")
    if not request.test_command.strip():
        raise InvalidArgument("test_command", "is required (e.g. 'python3 -m pytest -rA')")
    if not request.fail_to_pass:
        raise InvalidArgument("fail_to_pass", "name at least one test")
    for name in ("patch", "test_patch"):
        if len(getattr(request, name).encode()) > config.max_patch_bytes:
            raise InvalidArgument(name, f"is over eval.max_patch_bytes={config.max_patch_bytes}")
    timeout = request.timeout_s
    if not math.isfinite(timeout) or timeout < 0 or timeout > config.max_test_timeout_s:
        raise InvalidArgument("timeout_s", f"must be in [0, {config.max_test_timeout_s}] "
                              f"(0 = eval.test_timeout_s), got {timeout}")  # fmt: skip
    memory = request.memory_bytes
    if memory < 0 or memory > config.max_memory_bytes or 0 < memory < 64 << 20:
        raise InvalidArgument("memory_bytes", f"must be 0 (default) or in [64 MiB, "
                              f"{config.max_memory_bytes}], got {memory}")  # fmt: skip
    return timeout or config.test_timeout_s, memory or config.memory_bytes


class Evaluator:
    def __init__(self, config: EvalConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.admission = Admission(config.max_concurrent, config.max_queued)

    async def evaluate(self, request: swe_pb2.EvaluateRequest) -> swe_pb2.EvaluateResult:
        timeout, memory = _check(request, self.config)
        async with self.admission:
            return await self._run(request, timeout, memory)

    async def _run(self, request: swe_pb2.EvaluateRequest, timeout: float,
                   memory: int) -> swe_pb2.EvaluateResult:  # fmt: skip
        started = time.monotonic()
        result = swe_pb2.EvaluateResult(instance_id=request.instance_id)
        touched = touches_test_machinery(
            request.patch, request.test_patch, self.config.protected_files
        )
        if touched:
            result.status = swe_pb2.EVAL_STATUS_PATCH_FAILED
            result.error = (
                f"the patch touches the test machinery ({', '.join(touched[:5])}): such files "
                "can change how tests run or report, so the patch is refused "
                "(eval.protected_files)"
            )
            return result
        nonce = secrets.token_hex(16)
        payload = json.dumps({
            "workdir": request.workdir, "patch": request.patch,
            "test_patch": request.test_patch, "test_command": request.test_command,
            "nonce": nonce, "plugin": REPORT_PLUGIN,
            "protected": list(self.config.protected_files), "machinery": IMPORT_MACHINERY,
        }).encode()  # fmt: skip
        limits = Limits(memory, self.config.cpus, self.config.pids_limit)
        run = await self.backend.run(
            request.image, request.workdir, limits, ["python3", "-c", DRIVER], payload, timeout
        )
        output = run.output.decode(errors="replace")
        result.log_tail = output[-self.config.log_tail_bytes :]
        result.duration_s = time.monotonic() - started
        # Only the driver's lines count: they carry this call's nonce (see driver.py).
        ours = MARKER + nonce + " "
        markers = [line[len(ours) :] for line in output.splitlines() if line.startswith(ours)]
        if run.disk_written:
            # The patch's code filled the disk: its tests did not finish, so it scores 0.
            result.status = swe_pb2.EVAL_STATUS_COMPLETED
            result.error = (
                f"the container wrote {run.disk_written} bytes, over eval.disk_bytes="
                f"{self.config.disk_bytes}; it was stopped"
            )
            _, tests = score({}, list(request.fail_to_pass), list(request.pass_to_pass))
            result.tests.extend(tests)
        elif run.timed_out:
            result.status = swe_pb2.EVAL_STATUS_TIMEOUT
            result.error = f"killed at the deadline ({timeout:g} s)"
        elif refused := next((m for m in markers if m.startswith("refused ")), ""):
            # The driver's check of the applied tree (driver.py): what the text check missed.
            result.status = swe_pb2.EVAL_STATUS_PATCH_FAILED
            result.error = decode_refusal(refused[len("refused ") :]) + " (eval.protected_files)"
        elif any(m.startswith("apply-failed") for m in markers):
            which = next(m for m in markers if m.startswith("apply-failed")).split()[-1]
            result.status = swe_pb2.EVAL_STATUS_PATCH_FAILED
            result.error = f"{which} does not apply (git apply)"
        elif not any(m.startswith("tests-exit") for m in markers):
            result.status = swe_pb2.EVAL_STATUS_INFRA_ERROR
            result.error = f"the container did not run the tests (exit {run.returncode})"
        else:
            report = next((m[len("report ") :] for m in markers if m.startswith("report ")), "")
            outcomes, error = parse_report(report)
            result.error = error
            resolved, tests = score(
                outcomes, list(request.fail_to_pass), list(request.pass_to_pass)
            )
            missing = [
                t.name for t in tests if t.required and t.outcome == swe_pb2.TEST_OUTCOME_MISSING
            ]
            if missing and not result.error:
                result.error = (f"{len(missing)} required tests did not run "
                                f"({', '.join(missing[:3])}...)")  # fmt: skip
            result.status = swe_pb2.EVAL_STATUS_COMPLETED
            result.resolved = resolved
            result.tests.extend(tests)
        return result
