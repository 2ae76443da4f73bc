"""`swe_agent`: end-to-end SWE-RL (stage SWE2). The policy fixes a repository in the
instance's container through the swe-runner's agent tools; the reward is its tests.

OpenEpisode opens a swe-runner session (a container of the row's image, no network,
capped) owned by the gateway's client key; each tool call is one RunSweTool; `submit`
takes the patch (`git diff` against base_commit) and ends the episode. CloseEpisode runs
Evaluate on the submitted patch (or, if the policy never submitted, on the work tree as it
stands) in a fresh container: reward 1 iff every FAIL_TO_PASS and PASS_TO_PASS test
passes, as SWE-bench scores it. An infra problem (runner unreachable, image missing, the
tests timing out) is a failure with its kind (SANDBOX_ERROR, TIMEOUT), never a silent 0.
Abandoning (or the idle reaper) closes the session.

Row fields (SWE-bench / SWE-Gym row, plus what the runner needs; the bundled tiny
instances have them all): `instance_id`, `image`, `FAIL_TO_PASS` (a list or a JSON string
of one), and optional `workdir` (/testbed), `base_commit`, `test_patch`, `PASS_TO_PASS`,
`test_command`, `responses_create_params`. `patch` (the gold fix) is never shown or used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlfleet_contracts.swe_client import (
    SweRunnerClient,
    SweRunnerUnavailable,
    SweSessionGone,
    SweToolRefused,
)
from rlfleet_proto.v1 import swe_pb2

from rlfleet_reward.environments.base import optional_str, require_str
from rlfleet_reward.episodes.base import (
    CallOutcome,
    EpisodeContext,
    EpisodeEnvironment,
    Tool,
    ToolError,
)
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure, scored

_OVERHEAD_S = 5.0
"""Kept from each budget for the call itself, so the runner's watchdog fires first."""
_MAX_TESTS = 10_000
_MAX_SESSION_IDLE_S = 7200.0


def _obj(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


TOOLS = (
    Tool(
        "bash",
        "Run a bash command in the repository's root (a persistent container: files, but "
        "not shell variables or `cd`, carry over) and return its exit code and output.",
        _obj({"command": {"type": "string", "minLength": 1}}, ["command"]),
    ),
    Tool(
        "view",
        "Show a file with line numbers, or list a directory (path relative to the "
        "repository root, or absolute).",
        _obj({"path": {"type": "string", "minLength": 1}}, ["path"]),
    ),
    Tool(
        "edit",
        "Replace the one occurrence of old_str in the file by new_str; an empty old_str "
        "writes new_str as the whole file.",
        _obj(
            {
                "path": {"type": "string", "minLength": 1},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
            },
            ["path", "old_str", "new_str"],
        ),
    ),
    Tool(
        "submit",
        "Submit your changes to the repository as the fix and end the task.",
        _obj({}, []),
    ),
)
_TOOL_IDS = {
    "bash": swe_pb2.SWE_TOOL_BASH,
    "view": swe_pb2.SWE_TOOL_VIEW,
    "edit": swe_pb2.SWE_TOOL_EDIT,
    "submit": swe_pb2.SWE_TOOL_SUBMIT,
}


@dataclass(frozen=True)
class SweSpec:
    instance_id: str
    image: str
    workdir: str
    base_commit: str
    test_patch: str
    test_command: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]


@dataclass
class SweState:
    session_id: str
    submitted: str | None = None
    """The patch taken at `submit` (None: never submitted)."""
    calls: dict[str, int] = field(default_factory=dict)


def _tests(row: Mapping[str, Any], key: str, required: bool) -> tuple[str, ...]:
    value = row.get(key)
    if value is None:
        if required:
            raise RowError(key, "is required: the tests the fix must make pass")
        return ()
    if isinstance(value, str):  # SWE-bench publishes the lists as JSON strings
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError:
            raise RowError(key, "expected a list of test ids or a JSON string of one") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise RowError(key, "expected a list of non-empty test id strings")
    if len(value) > _MAX_TESTS:
        raise RowError(key, f"at most {_MAX_TESTS} tests")
    if required and not value:
        raise RowError(key, "must name at least one test")
    return tuple(value)


def _runner(ctx: EpisodeContext) -> SweRunnerClient:
    runner = ctx.swe_runner()
    if runner is None:
        raise SweRunnerUnavailable("no swe-runner is configured (reward config swe.target)")
    assert isinstance(runner, SweRunnerClient)
    return runner


class SweAgentEnvironment(EpisodeEnvironment):
    name: ClassVar[str] = "swe_agent"
    description: ClassVar[str] = (
        "Fix a repository in its SWE instance's container (bash/view/edit/submit through the "
        "swe-runner); reward 1 iff the instance's FAIL_TO_PASS and PASS_TO_PASS tests pass."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("instance_id", "image", "FAIL_TO_PASS")
    optional_fields: ClassVar[tuple[str, ...]] = (
        "workdir",
        "base_commit",
        "test_patch",
        "PASS_TO_PASS",
        "test_command",
        "problem_statement",
        "repo",
        "patch",
        "responses_create_params",
    )
    tools: ClassVar[tuple[Tool, ...]] = TOOLS

    def parse_row(self, row: Mapping[str, Any]) -> SweSpec:
        workdir = optional_str(row, "workdir", "/testbed")
        if not workdir.startswith("/"):
            raise RowError("workdir", f"must be an absolute path, got {workdir[:100]!r}")
        base = optional_str(row, "base_commit", "")
        if base and not all(c in "0123456789abcdef" for c in base.lower()):
            raise RowError("base_commit", "must be a hex commit id")
        test_command = optional_str(row, "test_command", "")
        if not test_command:
            test_command = "python3 -m pytest -rA -p no:cacheprovider"
        return SweSpec(
            instance_id=require_str(row, "instance_id"),
            image=require_str(row, "image"),
            workdir=workdir,
            base_commit=base,
            test_patch=optional_str(row, "test_patch", ""),
            test_command=test_command,
            fail_to_pass=_tests(row, "FAIL_TO_PASS", required=True),
            pass_to_pass=_tests(row, "PASS_TO_PASS", required=False),
        )

    async def open(self, spec: SweSpec, ctx: EpisodeContext) -> SweState:
        runner = _runner(ctx)
        try:
            session_id = await runner.open_session(
                instance_id=spec.instance_id,
                image=spec.image,
                workdir=spec.workdir,
                base_commit=spec.base_commit,
                memory_bytes=ctx.swe.memory_bytes,
                # The episode's own idle timeout frees the session first; the runner's
                # (sessions.max_idle_timeout_s, 7200 s by default) is the backstop.
                idle_timeout_s=min(ctx.idle_timeout_s + 60.0, _MAX_SESSION_IDLE_S),
            )
        except SweToolRefused as exc:  # the runner names its field (image, workdir, ...)
            raise RowError("instance", f"the swe-runner refused it: {exc}") from None
        return SweState(session_id)

    def _command_limit(self, ctx: EpisodeContext) -> float:
        return max(1.0, min(float(ctx.swe.command_timeout_s), ctx.tool_timeout_s - _OVERHEAD_S))

    async def call(
        self, state: SweState, tool: str, arguments: dict[str, Any], ctx: EpisodeContext
    ) -> CallOutcome:
        runner = _runner(ctx)
        state.calls[tool] = state.calls.get(tool, 0) + 1
        try:
            reply = await runner.run_tool(
                state.session_id,
                _TOOL_IDS[tool],
                timeout_s=self._command_limit(ctx),
                command=arguments.get("command", ""),
                path=arguments.get("path", ""),
                old_str=arguments.get("old_str", ""),
                new_str=arguments.get("new_str", ""),
            )
        except SweToolRefused as exc:
            raise ToolError(f"{tool}: {exc}") from None
        except SweSessionGone:
            raise ToolError("the task's container is gone (idle too long); submit") from None
        if reply.error:
            raise ToolError(reply.output or f"{tool} failed")
        if tool == "submit":
            state.submitted = reply.patch
            lines = reply.patch.count("\n")
            return CallOutcome(f"submitted ({lines} lines of diff)", done=True)
        if tool == "bash":
            text = f"exit code: {reply.exit_code}\n{reply.output}"
            if reply.timed_out:
                text += f"\n[timed out after {self._command_limit(ctx):g}s]"
            return CallOutcome(text)
        return CallOutcome(reply.output)

    async def score(
        self, spec: SweSpec, state: SweState, sample: Sample, ctx: EpisodeContext
    ) -> Score:
        runner = _runner(ctx)
        patch, how = state.submitted, "submitted"
        if patch is None:  # never submitted: score the work tree as it stands
            how = "work tree"
            try:
                reply = await runner.run_tool(
                    state.session_id, swe_pb2.SWE_TOOL_SUBMIT, timeout_s=self._command_limit(ctx)
                )
            except SweSessionGone:
                return failure(
                    FailureKind.SANDBOX_ERROR,
                    "the session ended before a patch was taken (idle timeout?)",
                )
            if reply.error:  # the runner answered: the policy wrecked its own container
                return scored(
                    {"resolved": 0.0},
                    patch_from="none",
                    error=f"no patch could be taken: {reply.output[-300:]}",
                    tool_calls=json.dumps(state.calls, sort_keys=True),
                )
            patch = reply.patch
        timeout = min(ctx.swe.test_timeout_s, ctx.close_timeout_s - ctx.swe.call_overhead_s)
        if timeout < 1.0:
            return failure(
                FailureKind.TIMEOUT,
                f"episodes.close_timeout_s ({ctx.close_timeout_s:g}) leaves no time for the tests "
                f"after swe.call_overhead_s ({ctx.swe.call_overhead_s:g})",
            )
        result = await runner.evaluate(
            instance_id=spec.instance_id,
            image=spec.image,
            workdir=spec.workdir,
            patch=patch,
            test_patch=spec.test_patch,
            test_command=spec.test_command,
            fail_to_pass=spec.fail_to_pass,
            pass_to_pass=spec.pass_to_pass,
            timeout_s=timeout,
            memory_bytes=ctx.swe.memory_bytes,
        )
        info: dict[str, object] = {
            "patch_from": how,
            "patch_lines": patch.count("\n"),
            "eval_status": swe_pb2.EvalStatus.Name(result.status),
            "tests_seconds": round(result.duration_s, 2),
            "tool_calls": json.dumps(state.calls, sort_keys=True),
        }
        if result.status == swe_pb2.EVAL_STATUS_TIMEOUT:
            return failure(
                FailureKind.TIMEOUT, f"the tests did not finish within {timeout:g}s", **info
            )
        if result.status not in (swe_pb2.EVAL_STATUS_COMPLETED, swe_pb2.EVAL_STATUS_PATCH_FAILED):
            return failure(
                FailureKind.SANDBOX_ERROR,
                f"Evaluate: {result.error[-300:] or 'infra error'}",
                **info,
            )
        required = [t for t in result.tests if t.required]
        passed = sum(1 for t in required if t.outcome == swe_pb2.TEST_OUTCOME_PASSED)
        return scored(
            {"resolved": 1.0 if result.resolved else 0.0},
            **info,
            required_tests_passed=f"{passed}/{len(required)}",
            error=result.error[-300:],
        )

    async def release(self, state: SweState, ctx: EpisodeContext) -> None:
        await _runner(ctx).close_session(state.session_id)
