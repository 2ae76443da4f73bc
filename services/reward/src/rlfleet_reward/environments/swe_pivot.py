"""`swe_pivot`: stage SWE1 (PivotRL): the policy's next action at a pivot turn of an agent
demonstration, rewarded for being functionally equivalent to the demonstrated action.

Row fields:
- `expected_action` (required): the demonstrated next call, `{"name": "bash" | "view" |
  "edit" | "submit" | other, "arguments": object or JSON string}`; bash needs `command`,
  view and edit need `path`, edit needs `new_str` (and `old_str`, "" = write the file).
- `workdir` (optional, default `/testbed`): where the agent's tools run; paths are
  compared relative to it.
- `files` (optional): `{path: content}` of files before the action; an edit is compared by
  applying both edits to `files[path]` (without it, by its strings).
- `responses_create_params` (the demonstration prefix and the tools), `instance_id`,
  `turn`: read by the trainer and data prep, not here.

The response is one assistant turn: its tool call is read from structured calls when the
face received them, else from `<tool_call>{json}</tool_call>` (Hermes). Reward 1 iff
exactly one call is made and it is equivalent by the rules of `swe_equivalence` (one
component, `equivalent_action`); info `verdict` says why not: `no_call`,
`malformed_call` (with `error`), `multiple_calls`, `not_equivalent` (with `reason`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rlfleet_reward.environments.base import Environment, optional_str, require
from rlfleet_reward.environments.swe_equivalence import (
    MAX_COMMAND_CHARS,
    apply_edit,
    compare,
    normalize_path,
)
from rlfleet_reward.environments.tool_use import decode_arguments
from rlfleet_reward.types import RowError, Sample, Score, scored

_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
MAX_CALLS_READ = 8
"""Calls past this many are not parsed: one is the task, two already score 0."""


@dataclass(frozen=True)
class PivotSpec:
    name: str
    arguments_json: str
    workdir: str
    files_json: str


def read_calls(text: str) -> tuple[list[tuple[str, dict[str, Any]]], str]:
    """(well-formed calls, the first problem of a malformed one or "") of Hermes text."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for n, match in enumerate(_CALL.finditer(text)):
        if n >= MAX_CALLS_READ:
            break
        if not match.group(2):
            return calls, "<tool_call> without </tool_call>"
        try:
            obj = json.loads(match.group(1).strip())
        except json.JSONDecodeError as exc:
            return calls, f"the tool call is not valid JSON: {exc.msg}"
        except RecursionError:
            return calls, "the tool call nests too deeply"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return calls, 'a tool call must be a JSON object with a "name" string'
        arguments = decode_arguments(obj.get("arguments", {}))
        if arguments is None:
            return calls, f'"arguments" of {obj["name"][:50]!r} is not a JSON object'
        calls.append((obj["name"], arguments))
    return calls, ""


def _check_action(name: str, args: dict[str, Any]) -> None:
    field = "expected_action.arguments"
    needs = {"bash": ("command",), "view": ("path",), "edit": ("path", "new_str")}
    for key in needs.get(name, ()):
        if not isinstance(args.get(key), str) or (key != "new_str" and not args[key].strip()):
            raise RowError(f"{field}.{key}", f"{name} needs a non-empty string {key}")
    if name == "edit" and not isinstance(args.get("old_str", ""), str):
        raise RowError(f"{field}.old_str", "expected a string")
    if name == "bash" and len(args["command"]) > MAX_COMMAND_CHARS:
        raise RowError(f"{field}.command", f"longer than {MAX_COMMAND_CHARS} characters")


class SwePivotEnvironment(Environment):
    name: ClassVar[str] = "swe_pivot"
    placement = "loop"  # linear rules over bounded strings (docs/reward.md)
    description: ClassVar[str] = (
        "SWE1 (PivotRL): the next agent action, rewarded for functional equivalence "
        "to the demonstrated one."
    )
    required_fields: ClassVar[tuple[str, ...]] = ("expected_action",)
    optional_fields: ClassVar[tuple[str, ...]] = (
        "workdir",
        "files",
        "responses_create_params",
        "instance_id",
        "turn",
    )

    def parse_row(self, row: Mapping[str, Any]) -> PivotSpec:
        expected = require(row, "expected_action")
        if not isinstance(expected, dict):
            raise RowError("expected_action", "expected an object with name and arguments")
        name = expected.get("name")
        if not isinstance(name, str) or not name.strip():
            raise RowError("expected_action.name", "required: the tool name")
        args = decode_arguments(expected.get("arguments", {}))
        if args is None:
            raise RowError("expected_action.arguments", "expected an object or a JSON string")
        _check_action(name, args)
        workdir = optional_str(row, "workdir", "/testbed")
        if not workdir.startswith("/"):
            raise RowError("workdir", f"must be an absolute path, got {workdir[:80]!r}")
        raw_files = row.get("files") or {}
        if not isinstance(raw_files, dict) or not all(
            isinstance(v, str) for v in raw_files.values()
        ):
            raise RowError("files", "expected an object of path -> file content (strings)")
        files = {normalize_path(p, workdir): c for p, c in raw_files.items()}
        if name == "edit":
            content = files.get(normalize_path(args["path"], workdir))
            if (
                content is not None
                and apply_edit(content, args.get("old_str", ""), args["new_str"]) is None
            ):
                raise RowError(
                    "expected_action.arguments.old_str",
                    "does not occur exactly once in files[path]: the demonstration's edit "
                    "does not apply",
                )
        return PivotSpec(name, json.dumps(args), workdir, json.dumps(files))

    def score(self, spec: PivotSpec, sample: Sample) -> Score:
        if sample.tool_calls:
            calls, error = [(c.name, c.arguments) for c in sample.tool_calls], ""
        else:
            calls, error = read_calls(sample.text)
        zero = {"equivalent_action": 0.0}
        if error:
            return scored(zero, verdict="malformed_call", error=error, num_calls=len(calls))
        if not calls:
            return scored(zero, verdict="no_call")
        if len(calls) > 1:
            return scored(zero, verdict="multiple_calls", num_calls=len(calls))
        name, arguments = calls[0]
        verdict = compare(
            spec.name,
            json.loads(spec.arguments_json),
            name,
            arguments,
            workdir=spec.workdir,
            files=json.loads(spec.files_json),
        )
        return scored(
            {"equivalent_action": 1.0 if verdict.equivalent else 0.0},
            verdict="equivalent" if verdict.equivalent else "not_equivalent",
            reason=verdict.reason,
            called=name,
            demonstrated=spec.name,
        )
