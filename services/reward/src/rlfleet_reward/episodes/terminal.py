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
  iff it exits 0. It runs in a fresh sandbox run, in the work dir (its cwd) holding a
  fresh copy of the final files, which it may read; see "The check" below.
- `responses_create_params.tools` (optional).

The check. The policy wrote every file of the work dir, and nothing it wrote may change
what the check's own programs do; its commands' processes are gone (each command was a
one-shot sandbox run). So the check runs:
- with the work dir's files and dirs read-only (`chmod a-w`): a write there fails, so
  the check writes under $TMPDIR. This stops accidents and programs that do not try;
  it does not stop a program the check runs (the policy's) from `chmod`ing them back:
  the sandbox has one uid, which owns them;
- with CHECK_ENV as its whole environment: HOME and TMPDIR fresh empty dirs outside the
  work dir, PATH of absolute system dirs only; Python with PYTHONSAFEPATH (neither cwd
  nor a script's dir on sys.path: a `json.py` in the work dir is not `json`) and
  PYTHONNOUSERSITE (no user site, so no `.pth` or `usercustomize.py` from a HOME the
  policy wrote; `sitecustomize` is looked up on sys.path only, i.e. in read-only /usr).
  A check that means to import the policy's module asks for it, after the standard
  library: `python3 -c "import sys; sys.path.append('.'); import solution"`;
- non-interactive `bash -c`, which reads no `.bashrc` (and BASH_ENV is not set);
- its result read from a report the runner prints last, carrying a per-call secret nonce
  read from stdin before the check starts; the runner is non-dumpable. A program the
  check runs that kills or stops the runner leaves no report: the check scores 0.
What a check must still not do: trust what a policy-written program says (its exit
status or output) beyond what the task allows, or run tools that take code or config
from the work dir (a `Makefile`, `.git/config` hooks and pagers, pytest's `conftest.py`
and ini files, node's `node_modules`). Such a program runs as the check's own user: it
can signal the check's shell or rewrite its memory (/proc/<pid>/mem of a dumpable
same-uid process), so a check that runs the policy's code trusts it.
"""

from __future__ import annotations

import base64
import json
import posixpath
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_contracts.sandbox_client import ExecStatus, SandboxUnavailable

from rlfleet_reward.environments.base import require_str
from rlfleet_reward.episodes.base import (
    CallOutcome,
    EpisodeContext,
    EpisodeEnvironment,
    Tool,
    ToolError,
)
from rlfleet_reward.types import RowError, Sample, Score, scored

_CALL_OVERHEAD_S = 5.0
_MAX_FILES = 1000
_MAX_CHECK_CHARS = 100_000
_ENVELOPE = "\x1erlfleet-terminal:"

# The check's whole environment (the sandbox's own is replaced, whatever it holds): a
# HOME outside the work dir, Python that puts neither cwd nor the script's dir on
# sys.path (PYTHONSAFEPATH) and reads no user site (.pth, usercustomize), and nothing
# a shell or interpreter would run at start (BASH_ENV, ENV, PYTHONSTARTUP, PYTHONPATH...).
CHECK_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONSAFEPATH": "1",
    "PYTHONNOUSERSITE": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}

# Runs inside the sandbox (Python there, standard library only). stdin: a per-call
# secret nonce line, then the command. Out: one JSON line after the marker and the
# nonce: exit code, output (capped), the work dir's files. Non-dumpable, so a process the
# command starts can neither read the nonce from its memory nor open its stdout through
# /proc/<pid>/fd to forge a report; without the nonce a report is not read.
_RUNNER = r"""
import base64, ctypes, json, os, subprocess, sys, tempfile
cap, max_state, timeout, is_check = {cap}, {max_state}, {timeout}, {is_check}
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
    sys.exit("cannot make the runner non-dumpable")
nonce = sys.stdin.readline().strip()
command = sys.stdin.read()
env = None
if is_check:
    # The policy's files are the check's input, not its code: read-only (chmod a-w), and
    # HOME a fresh empty dir outside the work dir.
    for root, dirs, names in os.walk("."):
        for name in names:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & 0o555)
    for root, dirs, names in os.walk(".", topdown=False):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o555)
    os.chmod(".", 0o555)
    home = tempfile.mkdtemp(prefix="check-home-", dir="/tmp")
    env = dict({check_env!r}, HOME=home, TMPDIR=tempfile.mkdtemp(prefix="check-tmp-", dir="/tmp"))
with tempfile.TemporaryFile(dir="/tmp") as fo, tempfile.TemporaryFile(dir="/tmp") as fe:
    try:  # output to files, not pipes: a command printing without end cannot fill memory
        code = subprocess.run(["bash", "-c", command], stdout=fo, stderr=fe, env=env,
                              stdin=subprocess.DEVNULL, timeout=timeout).returncode
        note = b""
    except subprocess.TimeoutExpired:
        code, note = 124, b"\n[timed out]"
    sizes = (fo.tell(), fe.tell())
    fo.seek(0)
    fe.seek(0)
    out, err = fo.read(cap), fe.read(cap) + note
files, total, too_big = {{}}, 0, False
for root, dirs, names in [] if is_check else os.walk("."):  # a check changes no state
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
sys.stdout.write({envelope!r} + nonce + ":" + json.dumps({{
    "exit_code": code, "stdout": out[:cap].decode(errors="replace"),
    "stderr": err[:cap].decode(errors="replace"), "cut": max(sizes) > cap,
    "files": None if too_big or is_check else files}}) + "\n")
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
    state_files: tuple[tuple[str, bytes, bool], ...],
    command: str,
    ctx: EpisodeContext,
    is_check: bool = False,
) -> tuple[int, str, tuple[tuple[str, bytes, bool], ...] | None]:
    """(exit code, output text, new files or None if over the state limit or a check).
    `is_check`: run as the goal check (read-only files, CHECK_ENV, module docstring)."""
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
        is_check=is_check,
        check_env=CHECK_ENV,
    )
    nonce = secrets.token_hex(16)
    outcome = await sandbox.execute(
        code, stdin=f"{nonce}\n{command}", timeout_s=limit_s, files=state_files
    )
    if outcome.status is ExecStatus.SANDBOX_ERROR:
        raise SandboxUnavailable(f"the sandbox could not run the command: {outcome.stderr[-300:]}")
    # Only a report carrying this call's nonce is the runner's (module docstring).
    _, marker, tail = outcome.stdout.rpartition(f"{_ENVELOPE}{nonce}:")
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
            exit_code, text, _ = await run_in_sandbox(state.files, spec.check, ctx, is_check=True)
        except ToolError as exc:  # the check itself timed out or blew up
            return scored({"check": 0.0}, check_exit="none", check_output=str(exc)[:500])
        return scored(
            {"check": 1.0 if exit_code == 0 else 0.0},
            check_exit=exit_code,
            check_output=text[-500:],
            commands=state.commands,
        )
