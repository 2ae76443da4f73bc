"""Domain types of the sandbox (what the faces translate the wire formats into), and the
pure rules that turn a run's raw facts into a status."""

from __future__ import annotations

import enum
import math
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from rlfleet_core.errors import InvalidArgument

from rlfleet_sandbox.config import LIMIT_NAMES, LimitsConfig


class Language(enum.Enum):
    PYTHON = "python"
    BASH = "bash"


class Status(enum.Enum):
    """Mirrors the proto's ExecStatus."""

    OK = "OK"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    MEMORY = "MEMORY"
    OUTPUT_LIMIT = "OUTPUT_LIMIT"
    SANDBOX_ERROR = "SANDBOX_ERROR"


@dataclass(frozen=True)
class RunLimits:
    """Limits of one run, already defaulted and clamped (see `resolve_limits`)."""

    timeout_s: float
    cpu_time_s: float
    memory_bytes: int
    max_processes: int
    max_file_size_bytes: int
    max_open_files: int
    max_output_bytes: int

    def for_runner(self) -> dict[str, Any]:
        return {
            "cpu_time_s": self.cpu_time_s,
            "memory_bytes": self.memory_bytes,
            "max_processes": self.max_processes,
            "max_file_size_bytes": self.max_file_size_bytes,
            "max_open_files": self.max_open_files,
        }


def resolve_limits(
    requested: dict[str, float], config: LimitsConfig, field_prefix: str = "limits"
) -> RunLimits:
    """0 (or absent) means the configured default; larger than the cap is clamped to the
    cap; negative is an error naming the field."""
    values: dict[str, Any] = {}
    for name in LIMIT_NAMES:
        value = requested.get(name, 0) or 0
        if math.isnan(value) or value < 0:
            raise InvalidArgument(
                f"{field_prefix}.{name}", f"must be >= 0 (0 = default), got {value}"
            )
        cap = getattr(config, f"max_{name}")
        chosen = min(value, cap) if value else getattr(config, name)
        values[name] = type(getattr(config, name))(chosen)
    return RunLimits(**values)


@dataclass(frozen=True)
class InputFile:
    path: str
    content: bytes
    executable: bool = False


_SAFE_PART = re.compile(r"^[A-Za-z0-9._+@=,-][A-Za-z0-9._+@=, -]*$")


def check_file_path(path: str, index: int) -> str:
    """A relative path inside the work dir: no '..', '.' or empty parts, no odd characters."""
    where = f"files[{index}].path"
    if not path or path.startswith("/"):
        raise InvalidArgument(where, f"must be a relative path inside the work dir, got {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidArgument(where, f"must stay inside the work dir (no '..'), got {path!r}")
    if not all(_SAFE_PART.match(p) for p in parts) or len(path) > 255:
        raise InvalidArgument(
            where, f"use letters, digits and . _ - + @ = , (max 255 chars), got {path!r}"
        )
    return path


@dataclass(frozen=True)
class ExecRequest:
    language: Language
    code: str
    limits: RunLimits
    stdin: bytes = b""
    files: tuple[InputFile, ...] = ()
    session_id: str = ""
    owner: str = ""
    """The caller's session owner (sessions.owner_of); set when `session_id` is."""


@dataclass
class ExecResult:
    status: Status
    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int = 0
    signal: int = 0
    wall_time_s: float = 0.0
    cpu_time_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunFacts:
    """What the runner and the service observed about one run."""

    exit_code: int
    signal: int
    cpu_s: float
    timed_out: bool
    memory_error: bool
    output_overflow: bool
    stderr_tail: bytes = b""
    cpu_exceeded: bool = False
    """The run's processes together used more CPU than the limit (the runner's meter, or
    the sandbox cgroup's cpu.stat)."""


_MEMORY_WORDS = (b"cannot allocate", b"memoryerror", b"out of memory", b"std::bad_alloc")


def classify(facts: RunFacts, limits: RunLimits) -> Status:
    """The status of a run. Order matters: our own kill reasons first (output cap, wall
    clock, the run's CPU and memory budgets over all its processes), then the kernel's
    (CPU rlimit signals), then the program's own outcome."""
    if facts.output_overflow:
        return Status.OUTPUT_LIMIT
    if facts.timed_out or facts.cpu_exceeded:
        return Status.TIMEOUT
    if facts.memory_error:
        return Status.MEMORY
    if facts.signal == signal.SIGXCPU or (
        facts.signal == signal.SIGKILL and facts.cpu_s >= int(limits.cpu_time_s + 0.999)
    ):
        return Status.TIMEOUT
    if facts.signal == 0 and facts.exit_code == 0:
        return Status.OK
    if any(word in facts.stderr_tail.lower() for word in _MEMORY_WORDS):
        return Status.MEMORY
    return Status.ERROR
