"""`terminal`: shell commands over a work dir, with a check script that verifies the end
state.

Where the state lives: in the episode, as the work dir's files. Each `bash` command is a
fresh one-shot sandbox run (the sandbox's usual isolation and limits: no network,
read-only system, capped memory, processes and time) that receives the files, runs the
command with `bash -c` in the work dir, and sends back its output and a snapshot of the
files, which becomes the new state. Chosen over stateful bash sessions in the sandbox
because it needs nothing new there, a crashed or killed command cannot corrupt a live
session, and a gateway restart loses no sandbox resources. What does not persist between
commands: processes, shell variables, `cd`, empty directories (each command starts anew
in the work dir, as a fresh bash in a session's dir would). The state is bounded by
`episodes.max_state_bytes`, and it is sent with every command.

Row fields:
- `files` (optional): `{path: content}` written into the work dir at the start
  (relative paths, text; not executable: a command or the check can `chmod`).
- `check` (required): a bash script run at CloseEpisode over the final files; reward 1
  iff it exits 0. It runs like a command, so it may read every file.
- `responses_create_params.tools` (optional).
"""

from __future__ import annotations

import base64
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import require_str
from rlfleet_reward.episodes.base import (
    CallOutcome,
    EpisodeContext,
    EpisodeEnvironment,
    Tool,
    ToolError,
)
from rlfleet_reward.sandbox_client import ExecStatus, SandboxUnavailable
from rlfleet_reward.types import RowError, Sample, Score, scored

_CALL_OVERHEAD_S = 5.0
_MAX_FILES = 1000
_MAX_CHECK_CHARS = 100_000
_ENVELOPE = "\x1erlfleet-terminal:"

# Runs inside the sandbox (Python there, standard library only): the command from stdin,
# then one JSON line after a marker: exit code, output (capped), the work dir's files.
_RUNNER = r"""
import base64, json, os, subprocess, sys, tempfile
cap, max_state, timeout = {cap}, {max_state}, {timeout}
command = sys.stdin.read()
with tempfile.TemporaryFile(dir="/tmp") as fo, tempfile.TemporaryFile(dir="/tmp") as fe:
    try:  # output to files, not pipes: a command printing without end cannot fill memory
        code = subprocess.run(["bash", "-c", command], stdout=fo, stderr=fe,
                              stdin=subprocess.DEVNULL, timeout=timeout).returncode
        note = b""
    except subprocess.TimeoutExpired:
        code, note = 124, b"\n[timed out]"
    sizes = (fo.tell(), fe.tell())
    fo.seek(0)
    fe.seek(0)
    out, err = fo.read(cap), fe.read(cap) + note
files, total, too_big = {{}}, 0, False
for root, dirs, names in os.walk("."):
    dirs.sort()
    for name in sorted(names):
        path = os.path.join(root, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read(max_state + 1)
        total += len(data)
        if total > max_state or len(files) >= {max_files}:
            too_big = True
            break
        files[os.path.relpath(path)] = [base64.b64encode(data).decode(), os.access(path, os.X_OK)]
    if too_big:
        break
sys.stdout.write({envelope!r} + json.dumps({{
    "exit_code": code, "stdout": out[:cap].decode(errors="replace"),
    "stderr": err[:cap].decode(errors="replace"), "cut": max(sizes) > cap,
    "files": None if too_big else files}}) + "\n")
"""

TOOLS = (
    Tool(
        "bash",
        "Run a bash command in the task's work dir and return its exit code and output. "
        "Each command starts anew in the work dir: files persist, processes, variables "
        "and `cd` do not.",
        {
            "type": "object",
            "properties": {"command": {"type": "string", "minLength": 1}},
            "required": ["command"],
            "additionalProperties": False,
        },
    ),
)


@dataclass(frozen=True)
class TerminalSpec:
    files: tuple[tuple[str, bytes, bool], ...]
    check: str


@dataclass
class TerminalState:
    files: tuple[tuple[str, bytes, bool], ...]
    commands: int = 0


def _clean_path(path: str, where: str) -> str:
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm.startswith("..") or norm == "." or "\x00" in path:
        raise RowError(where, f"must be a relative path inside the work dir, got {path[:100]!r}")
    return norm


async def run_in_sandbox(
    state_files: tuple[tuple[str, bytes, bool], ...], command: str, ctx: EpisodeContext
) -> tuple[int, str, tuple[tuple[str, bytes, bool], ...] | None]:
    """(exit code, output text, new files or None if over the state limit)."""
    sandbox = ctx.sandbox()
    if sandbox is None:
        raise SandboxUnavailable("no sandbox is configured (sandbox.target)")
    limit_s = max(1.0, ctx.tool_timeout_s - _CALL_OVERHEAD_S)
    code = _RUNNER.format(
        cap=ctx.max_output_chars,
        max_state=ctx.max_state_bytes,
        timeout=max(0.5, limit_s - 1.0),  # the command stops before the run's own limit
        max_files=_MAX_FILES,
        envelope=_ENVELOPE,
    )
    outcome = await sandbox.execute(code, stdin=command, timeout_s=limit_s, files=state_files)
    if outcome.status is ExecStatus.SANDBOX_ERROR:
        raise SandboxUnavailable(f"the sandbox could not run the command: {outcome.stderr[-300:]}")
    _, marker, tail = outcome.stdout.rpartition(_ENVELOPE)
    if not marker:
        why = {ExecStatus.TIMEOUT: "timed out", ExecStatus.MEMORY: "ran out of memory"}.get(
            outcome.status, f"stopped ({outcome.status.value})"
        )
        raise ToolError(f"the command {why}; the files are as they were before it")
    report = json.loads(tail)
    text = f"exit code: {report['exit_code']}\n"
    if report["stdout"]:
        text += report["stdout"]
    if report["stderr"]:
        text += ("\n" if not text.endswith("\n") else "") + "[stderr]\n" + report["stderr"]
    if report["cut"]:
        text += "\n[output truncated]"
    files = report["files"]
    if files is None:
        return report["exit_code"], text, None
    new = tuple(
        sorted((path, base64.b64decode(data), bool(x)) for path, (data, x) in files.items())
    )
    return int(report["exit_code"]), text, new


class TerminalEnvironment(EpisodeEnvironment):
    name: ClassVar[str] = "terminal"
    description: ClassVar[str] = (
        "Shell commands (`bash` tool) over a work dir in the sandbox; reward 1 iff the row's "
        "check script exits 0 on the final files."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("check",)
    optional_fields: ClassVar[tuple[str, ...]] = ("files", "responses_create_params")
    tools: ClassVar[tuple[Tool, ...]] = TOOLS

    def parse_row(self, row: Mapping[str, Any]) -> TerminalSpec:
        check = require_str(row, "check")
        if len(check) > _MAX_CHECK_CHARS:
            raise RowError("check", f"at most {_MAX_CHECK_CHARS} characters")
        given = row.get("files") or {}
        if not isinstance(given, dict):
            raise RowError("files", "expected an object of path -> content")
        if len(given) > _MAX_FILES:
            raise RowError("files", f"at most {_MAX_FILES} files")
        files = []
        for path, content in given.items():
            where = f"files.{path[:100]}"
            if not isinstance(content, str):
                raise RowError(where, "expected the file's text")
            files.append((_clean_path(path, where), content.encode(), False))
        return TerminalSpec(tuple(sorted(files)), check)

    async def open(self, spec: TerminalSpec, ctx: EpisodeContext) -> TerminalState:
        size = sum(len(content) for _, content, _ in spec.files)
        if size > ctx.max_state_bytes:
            raise RowError(
                "files", f"hold {size} bytes; episodes.max_state_bytes is {ctx.max_state_bytes}"
            )
        return TerminalState(spec.files)

    async def call(
        self, state: TerminalState, tool: str, arguments: dict[str, Any], ctx: EpisodeContext
    ) -> CallOutcome:
        _, text, files = await run_in_sandbox(state.files, arguments["command"], ctx)
        state.commands += 1
        if files is None:
            raise ToolError(
                f"{text}\n[the work dir grew past {ctx.max_state_bytes} bytes: this command's "
                "changes to files were dropped]"
            )
        state.files = files
        return CallOutcome(text)

    async def score(
        self, spec: TerminalSpec, state: TerminalState, sample: Sample, ctx: EpisodeContext
    ) -> Score:
        try:
            exit_code, text, _ = await run_in_sandbox(state.files, spec.check, ctx)
        except ToolError as exc:  # the check itself timed out or blew up
            return scored({"check": 0.0}, check_exit="none", check_output=str(exc)[:500])
        return scored(
            {"check": 1.0 if exit_code == 0 else 0.0},
            check_exit=exit_code,
            check_output=text[-500:],
            commands=state.commands,
        )
