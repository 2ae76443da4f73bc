"""`code`: competition-style programs run against unit tests in the sandbox service.

Row fields (HumanEval rows load as they ship):
- `test` (or `tests`) + `entry_point`: HumanEval-style test code defining
  `check(candidate)`. The sandbox runs the trusted harness of `code_harness.py`: the
  response's code in one process, the tests in another that calls the entry point over a
  pipe with plain values (see that module for why). Passing = the harness's verdict line
  carries this call's secret nonce and says "pass"; the exit code counts for nothing, so
  exit tricks (`sys.exit(0)`, an atexit `os._exit(0)`), always-equal objects and patched
  builtins score 0. Arguments and results must be plain data (numbers, strings, bytes,
  None, and lists/tuples/sets/dicts of them); tests that check in-place mutation of an
  argument or pass functions are not supported (info `error` says so).
- `test_cases` (instead of `test`): a list of `{"input": stdin, "output": expected stdout}`;
  outputs are compared after trimming trailing whitespace on every line.
- `verifier_metadata.unit_tests` (instead of `test_cases`; NeMo-Gym code_gen's shape):
  `{"inputs": [stdin, ...], "outputs": [stdout, ...], "fn_name": null}`, or the same
  object zlib-compressed, base64-encoded as `{"packed": ...}`; read as `test_cases`.
  Call-based tests (`fn_name` set) are refused naming the field.
- `prompt` (optional): the function header of a completion-style task; prepended when the
  response's code does not define `entry_point` itself.
- `timeout_s` (optional, default 10): wall-clock limit per program run.
- `partial_credit` (optional, default false, `test_cases` only): reward = fraction of cases
  passed (component `tests_passed`); otherwise 1 only if all pass.

The program is the last ```python block of the response (else any fenced block, else the
whole text). Runs go through the gateway's `SandboxClient` (gRPC, deadline on every
call). A program that fails, times out or runs out of memory scores 0 with the sandbox's
status in `info`; a sandbox that cannot run it gives a SANDBOX_ERROR failure instead.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import secrets
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rlfleet_contracts.sandbox_client import ExecOutcome, ExecStatus, SandboxUnavailable

from rlfleet_reward.environments.base import Environment, RunContext, optional_bool, optional_number
from rlfleet_reward.text import extract_code
from rlfleet_reward.types import FailureKind, RowError, Sample, Score, failure, scored

_MAX_PARALLEL_CASES = 4
_HARNESS = (Path(__file__).parent / "code_harness.py").read_text()


@dataclass(frozen=True)
class CodeSpec:
    test: str
    entry_point: str
    prompt: str
    cases: tuple[tuple[str, str], ...]
    timeout_s: float
    partial_credit: bool


def _parse_cases(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise RowError("test_cases", "expected a non-empty list of {input, output} objects")
    cases = []
    for i, case in enumerate(raw):
        if (
            not isinstance(case, dict)
            or not isinstance(case.get("input", ""), str)
            or not isinstance(case.get("output"), str)
        ):
            raise RowError(f"test_cases[{i}]", 'expected {"input": str, "output": str}')
        cases.append((case.get("input", ""), case["output"]))
    return tuple(cases)


_UNIT_TESTS = "verifier_metadata.unit_tests"
_MAX_UNPACKED_BYTES = 64 << 20


def _unpack(packed: Any) -> Any:
    """`{"packed": b64(zlib(json))}` -> the object, bounded so a zip bomb is refused."""
    field = f"{_UNIT_TESTS}.packed"
    if not isinstance(packed, str):
        raise RowError(field, "expected base64 text")
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(packed, validate=True), _MAX_UNPACKED_BYTES)
        if inflater.unconsumed_tail:
            raise RowError(field, f"unpacks to more than {_MAX_UNPACKED_BYTES} bytes")
        return json.loads(raw)
    except (binascii.Error, zlib.error, ValueError) as exc:
        raise RowError(field, f"not base64 zlib-compressed JSON ({exc})") from None


def _nemo_gym_cases(metadata: Any) -> tuple[tuple[str, str], ...]:
    """NeMo-Gym code_gen's `verifier_metadata.unit_tests` as stdin/stdout cases."""
    if not isinstance(metadata, dict) or not isinstance(metadata.get("unit_tests"), dict):
        raise RowError(_UNIT_TESTS, 'expected {"inputs": [...], "outputs": [...]}')
    tests = metadata["unit_tests"]
    fn_name = tests.get("fn_name")
    if "packed" in tests:
        tests = _unpack(tests["packed"])
        if not isinstance(tests, dict):
            raise RowError(f"{_UNIT_TESTS}.packed", "expected a JSON object inside")
        fn_name = fn_name or tests.get("fn_name")
    if fn_name:
        raise RowError(
            f"{_UNIT_TESTS}.fn_name",
            f"call-based tests ({fn_name!r}) are not supported; use stdin/stdout tests "
            "(fn_name null) or HumanEval `test` + `entry_point`",
        )
    inputs, outputs = tests.get("inputs"), tests.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise RowError(_UNIT_TESTS, "expected `inputs` and `outputs` lists of the same length")
    try:
        return _parse_cases(
            [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
        )
    except RowError as exc:
        where = exc.field.removeprefix("test_cases")
        raise RowError(f"{_UNIT_TESTS}{where}", "expected string inputs and outputs") from None


def outputs_match(expected: str, got: str) -> bool:
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return norm(expected) == norm(got)


def build_solution(spec: CodeSpec, code: str) -> str:
    """The response's code, after the prompt's header when it does not define the entry
    point itself (completion-style answers)."""
    defines_entry = re.search(rf"^\s*def\s+{re.escape(spec.entry_point)}\s*\(", code, re.MULTILINE)
    return spec.prompt + code if spec.prompt and not defines_entry else code


def build_harness_run(spec: CodeSpec, code: str) -> tuple[str, str, str]:
    """(program, stdin, nonce) of one harness run: the program holds the solution, stdin
    the tests and the nonce, which the solution's process never sees."""
    nonce = secrets.token_hex(16)
    program = f"{_HARNESS}\nmain({build_solution(spec, code)!r}, {spec.entry_point!r})\n"
    task = {
        "nonce": nonce,
        "prompt": spec.prompt,
        "test": spec.test,
        "entry_point": spec.entry_point,
    }
    return program, json.dumps(task), nonce


class CodeEnvironment(Environment):
    name: ClassVar[str] = "code"
    description: ClassVar[str] = (
        "Programs run against unit tests (HumanEval check() or stdin/stdout cases) in the sandbox."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("test|test_cases|verifier_metadata",)
    optional_fields: ClassVar[tuple[str, ...]] = (
        "entry_point",
        "prompt",
        "timeout_s",
        "partial_credit",
    )

    def parse_row(self, row: Mapping[str, Any]) -> CodeSpec:
        test = row.get("test", row.get("tests"))
        timeout_s = optional_number(row, "timeout_s", 10.0, low=0.1, high=300.0)
        partial = optional_bool(row, "partial_credit", False)
        if test is not None:
            if not isinstance(test, str) or not test.strip():
                raise RowError("test", "expected the test code as a non-empty string")
            entry_point = row.get("entry_point")
            if not isinstance(entry_point, str) or not entry_point.isidentifier():
                raise RowError(
                    "entry_point", f"required with `test`: the function name, got {entry_point!r}"
                )
            prompt = row.get("prompt") or ""
            if not isinstance(prompt, str):
                raise RowError("prompt", "expected a string")
            return CodeSpec(test, entry_point, prompt, (), timeout_s, partial)
        if row.get("test_cases") is not None:
            cases = _parse_cases(row["test_cases"])
        elif row.get("verifier_metadata") is not None:
            cases = _nemo_gym_cases(row["verifier_metadata"])
        else:
            raise RowError(
                "test",
                "required: `test` (with `entry_point`), `test_cases` or "
                "`verifier_metadata.unit_tests` (NeMo-Gym code_gen)",
            )
        return CodeSpec("", "", "", cases, timeout_s, partial)

    async def run(self, spec: CodeSpec, sample: Sample, ctx: RunContext) -> Score:
        sandbox = ctx.sandbox()
        if sandbox is None:
            return failure(FailureKind.SANDBOX_ERROR, "no sandbox configured (set sandbox.target)")
        code = extract_code(sample.text)
        if not code.strip():
            return scored({"tests_passed": 0.0}, verdict="no_code")
        timeout_s = min(spec.timeout_s, max(0.1, ctx.timeout_s - 1.0))
        try:
            if spec.test:
                program, stdin, nonce = build_harness_run(spec, code)
                outcome = await sandbox.execute(program, stdin=stdin, timeout_s=timeout_s)
                return _score_unit_tests(outcome, nonce)
            return await _score_cases(spec, code, sandbox, timeout_s)
        except SandboxUnavailable as exc:
            return failure(FailureKind.SANDBOX_ERROR, str(exc))


def _check_sandbox(outcome: ExecOutcome) -> None:
    if outcome.status is ExecStatus.SANDBOX_ERROR:
        raise SandboxUnavailable(f"sandbox could not run the program: {outcome.stderr[-300:]}")


def read_verdict(stdout: str, nonce: str) -> tuple[str, str]:
    """(verdict, error) from the harness's last stdout line; "no_verdict" when there is
    no line carrying `nonce` (the harness was killed, or something else wrote)."""
    lines = stdout.rstrip("\n").rsplit("\n", 1)
    try:
        record = json.loads(lines[-1])
    except ValueError:
        return "no_verdict", ""
    if not isinstance(record, dict) or record.get("nonce") != nonce:
        return "no_verdict", ""
    verdict = record.get("verdict")
    return ("pass", "") if verdict == "pass" else ("fail", str(record.get("error", ""))[:300])


def _score_unit_tests(outcome: ExecOutcome, nonce: str) -> Score:
    _check_sandbox(outcome)
    verdict, error = read_verdict(outcome.stdout, nonce)
    passed = verdict == "pass" and outcome.status is ExecStatus.OK and outcome.exit_code == 0
    return scored(
        {"tests_passed": 1.0 if passed else 0.0},
        verdict=verdict,
        error=error,
        status=outcome.status.value,
        exit_code=outcome.exit_code,
        stderr_tail=outcome.stderr[-300:],
        wall_time_s=f"{outcome.wall_time_s:.3f}",
    )


async def _score_cases(spec: CodeSpec, code: str, sandbox: Any, timeout_s: float) -> Score:
    limit = asyncio.Semaphore(_MAX_PARALLEL_CASES)

    async def run_case(stdin: str) -> ExecOutcome:
        async with limit:
            outcome: ExecOutcome = await sandbox.execute(code, stdin=stdin, timeout_s=timeout_s)
            return outcome

    outcomes = await asyncio.gather(*(run_case(stdin) for stdin, _ in spec.cases))
    passed = 0
    statuses = []
    for (_, expected), outcome in zip(spec.cases, outcomes, strict=True):
        _check_sandbox(outcome)
        ok = outcome.status is ExecStatus.OK and outputs_match(expected, outcome.stdout)
        passed += ok
        statuses.append(
            "pass"
            if ok
            else outcome.status.value
            if outcome.status is not ExecStatus.OK
            else "wrong_output"
        )
    fraction = passed / len(spec.cases)
    value = fraction if spec.partial_credit else float(passed == len(spec.cases))
    return scored(
        {"tests_passed": value}, passed=f"{passed}/{len(spec.cases)}", cases=",".join(statuses)
    )
