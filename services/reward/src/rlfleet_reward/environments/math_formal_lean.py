"""`math_formal_lean`: Lean 4 proofs checked by compiling them; refused until a Lean 4
toolchain is available.

Compiling a proof needs Lean 4 with Mathlib, and the sandbox service runs only Python
and bash (NeMo-Skills' sandbox, which NeMo-Gym's server calls, names it language
`lean4`). So every request is refused before any work: after its row fields are checked,
with `LeanUnavailable` — gRPC FAILED_PRECONDITION, HTTP 422 on the field `env` — whose
message says what is missing and how to enable it (`LEAN_MISSING`). It is never scored
0: a proof that could not be checked is not a wrong proof.

The interface is ready. Row fields (NeMo-Gym math_formal_lean; its rows load as they ship):
- `header` (required): imports and options before the theorem (`import Mathlib ...`).
- `formal_statement` (required): the theorem, ending in `:= by`.
- `informal_prefix`, `name` (optional): the informal statement (a doc comment) and the
  problem's name.
The proof will be the last ```lean4 (or ```lean) block of the response, compiled as
header + statement + proof in the sandbox's `lean4` language; `sorry` or any error
scores 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
from rlfleet_core.errors import InvalidArgument

from rlfleet_reward.environments.base import Environment, optional_str, require_str
from rlfleet_reward.types import Sample, Score

LEAN_MISSING = (
    "math_formal_lean needs a Lean 4 toolchain with Mathlib to compile proofs, and this "
    "deployment has none: the sandbox service runs python and bash only (no `lean4` "
    "language). To enable it, give the sandbox image Lean 4 + Mathlib and a `lean4` "
    "language, then implement the compile step of this environment; until then, leave "
    "math_formal_lean rows out of the blend"
)


class LeanUnavailable(InvalidArgument):
    """The request is well formed but cannot be served here (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


@dataclass(frozen=True)
class LeanSpec:
    header: str
    formal_statement: str
    informal_prefix: str
    name: str


class MathFormalLeanEnvironment(Environment):
    name: ClassVar[str] = "math_formal_lean"
    description: ClassVar[str] = (
        "Lean 4 proofs compiled against the formal statement: refused here (no Lean 4 "
        "toolchain in the sandbox)."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("header", "formal_statement")
    optional_fields: ClassVar[tuple[str, ...]] = ("informal_prefix", "name")

    def check_row(self, row: Mapping[str, Any]) -> LeanSpec:
        """The row's fields, validated (RowError names a bad one)."""
        return LeanSpec(
            header=require_str(row, "header", allow_empty=True),
            formal_statement=require_str(row, "formal_statement"),
            informal_prefix=optional_str(row, "informal_prefix", ""),
            name=optional_str(row, "name", ""),
        )

    def parse_row(self, row: Mapping[str, Any]) -> LeanSpec:
        self.check_row(row)
        raise LeanUnavailable("env", LEAN_MISSING)

    async def run(self, spec: LeanSpec, sample: Sample, ctx: Any) -> Score:
        raise LeanUnavailable("env", LEAN_MISSING)  # parse_row refuses first; kept as a guard
