r"""`math_with_code`: math problems solved with a Python tool; the final answer is graded
as `math` grades it.

The policy calls the `execute_python` tool during its episode (tool_routes.py /
python_tool.py: a stateful session in the sandbox per episode, the episode found by its
caller and `X-Session-ID`, so no other caller reaches it); the multi-turn loop that
calls it belongs to the agentic rollout. This environment scores the episode's final
answer.

Row fields (NeMo-Gym math_with_code shape; its example rows load as they ship):
- `expected_result` (or `expected_answer`; required): the gold answer.
- `expected_code_contains` (optional): accepted and ignored, as NeMo-Gym does.

Grading is `math`'s (math.py): the last \boxed{} of the final text, else math-verify's
own extraction, else a "Final answer:" line, checked for mathematical equivalence with
math-verify, with the same bounds on pathological answers. This is more lenient than
NeMo-Gym's math_with_code server, which compares the boxed answer as a normalised
string or a float (1e-6): `\frac{1}{2}` against `0.5` scores 1 here, 0 there. NeMo-Gym
also reads a \boxed{} printed by the tool when the message has none; tool outputs do
not reach this gateway's verify, so such an answer scores 0 here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, require_str
from rlfleet_reward.environments.math import MathEnvironment, MathSpec
from rlfleet_reward.types import RowError, Sample, Score


class MathWithCodeEnvironment(Environment):
    name: ClassVar[str] = "math_with_code"
    description: ClassVar[str] = (
        "Math with a stateful Python tool (POST /math_with_code/execute_python); the final "
        "answer is checked for equivalence with math-verify."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_result|expected_answer",)
    optional_fields: ClassVar[tuple[str, ...]] = ("expected_code_contains", "question")
    preload_modules: ClassVar[tuple[str, ...]] = MathEnvironment.preload_modules

    def parse_row(self, row: Mapping[str, Any]) -> MathSpec:
        key = "expected_result" if row.get("expected_result") is not None else "expected_answer"
        if row.get(key) is None:
            raise RowError("expected_result", "required (or expected_answer), but missing")
        code_contains = row.get("expected_code_contains")
        if code_contains is not None and not isinstance(code_contains, str):
            raise RowError("expected_code_contains", "expected a string")
        return MathSpec(expected_answer=require_str(row, key))

    def score(self, spec: MathSpec, sample: Sample) -> Score:
        return MathEnvironment().score(spec, sample)
