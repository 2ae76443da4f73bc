r"""`math_python`: a math problem solved with a `python` tool; the final answer is graded
as `math` grades it.

Each episode has its own stateful Python session in the sandbox service (opened by
OpenEpisode, closed by CloseEpisode or the episode's idle timeout; the sandbox's own
idle timeout is the same, so a lost gateway leaks nothing for long). Variables of one
call are there in the next. The program's own failures (exception, timeout, memory) are
ordinary results the policy reads (error=false, the traceback in the content); only a
sandbox that cannot run code gives error=true.

Row fields: `expected_answer` (or `expected_result`, required), `extraction`
(optional, as in `math`), `responses_create_params.tools` (optional).
Grading: `math`'s (the last \boxed{} of the final answer, math-verify equivalence), in
the gateway's verifier pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_contracts.sandbox_client import ExecStatus, SandboxUnavailable, SessionGone

from rlfleet_reward.environments.base import choice, require_str
from rlfleet_reward.environments.math import EXTRACTION_MODES, MathSpec
from rlfleet_reward.episodes.base import (
    CallOutcome,
    EpisodeContext,
    EpisodeEnvironment,
    Tool,
    ToolError,
)
from rlfleet_reward.python_tool import tool_answer
from rlfleet_reward.types import RowError, Sample, Score

_CALL_OVERHEAD_S = 5.0
"""Part of the tool's time kept for the sandbox round trip: the code's own limit is less."""

TOOLS = (
    Tool(
        "python",
        "Run Python code in a persistent session (variables stay between calls). "
        "Printed output and the value of a trailing expression are returned.",
        {
            "type": "object",
            "properties": {"code": {"type": "string", "minLength": 1}},
            "required": ["code"],
            "additionalProperties": False,
        },
    ),
)


@dataclass
class PythonState:
    session_id: str


def sandbox_of(ctx: EpisodeContext) -> Any:
    sandbox = ctx.sandbox()
    if sandbox is None or not hasattr(sandbox, "create_session"):
        raise SandboxUnavailable("no sandbox with sessions is configured (sandbox.target)")
    return sandbox


def render(answer: Mapping[str, Any]) -> str:
    """NeMo-Gym's ExecutePythonResponse as the text the policy reads."""
    parts = [answer["stdout"]] if answer["stdout"] else []
    if answer["stderr"]:
        parts.append("[stderr]\n" + answer["stderr"])
    if answer["error_message"]:
        parts.append("[error] " + answer["error_message"])
    return "\n".join(parts) or "(no output)"


class MathPythonEnvironment(EpisodeEnvironment):
    name: ClassVar[str] = "math_python"
    description: ClassVar[str] = (
        "Math with a stateful `python` tool run in the sandbox; the final answer is checked "
        "as `math` checks it."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_answer|expected_result",)
    optional_fields: ClassVar[tuple[str, ...]] = ("extraction", "responses_create_params")
    tools: ClassVar[tuple[Tool, ...]] = TOOLS

    def parse_row(self, row: Mapping[str, Any]) -> MathSpec:
        key = "expected_answer" if row.get("expected_answer") is not None else "expected_result"
        if row.get(key) is None:
            raise RowError("expected_answer", "required (or expected_result), but missing")
        return MathSpec(
            require_str(row, key), choice(row, "extraction", EXTRACTION_MODES, "nemo_gym")
        )

    async def open(self, spec: MathSpec, ctx: EpisodeContext) -> PythonState:
        sandbox = sandbox_of(ctx)
        session_id = await sandbox.create_session(
            idle_timeout_s=ctx.idle_timeout_s, timeout_s=self._code_limit(ctx)
        )
        return PythonState(session_id)

    def _code_limit(self, ctx: EpisodeContext) -> float:
        return max(1.0, ctx.tool_timeout_s - _CALL_OVERHEAD_S)

    async def call(
        self, state: PythonState, tool: str, arguments: dict[str, Any], ctx: EpisodeContext
    ) -> CallOutcome:
        try:
            outcome = await sandbox_of(ctx).execute(
                arguments["code"], timeout_s=self._code_limit(ctx), session_id=state.session_id
            )
        except SessionGone:
            raise ToolError(
                "the Python session has ended (idle too long); its state is gone"
            ) from None
        if outcome.status is ExecStatus.SANDBOX_ERROR:
            raise ToolError(f"the sandbox could not run the code: {outcome.stderr[-300:]}")
        return CallOutcome(render(tool_answer(outcome)))

    async def score(
        self, spec: MathSpec, state: PythonState, sample: Sample, ctx: EpisodeContext
    ) -> Score:
        return await ctx.verify("math", spec, sample, ctx.close_timeout_s)

    async def release(self, state: PythonState, ctx: EpisodeContext) -> None:
        await sandbox_of(ctx).close_session(state.session_id)
