"""SWE instances (SWE-bench / SWE-Gym / R2E-Gym rows, and the bundled tiny ones) as
training rows of the multi-turn environment `swe_agent` (stage SWE2).

A training row is NeMo-Gym-shaped: `responses_create_params.input` holds the task as the
user message (the problem statement and how to work: the repository's path, the tools,
submit), `agent_ref.name` is `swe_agent`, and the instance's fields ride along for the
environment (`instance_id`, `image`, `workdir`, `base_commit`, `test_patch`,
`FAIL_TO_PASS`, `PASS_TO_PASS`, `test_command`, `repo`). The gold `patch` is left out: the
policy never sees it and scoring does not need it.

Two ways in: a blend row `{"_placeholder": {"source": "swe_tiny", "instance_id": ...}}`
(the bundled instances, `tiny-swe2`), or a raw instance row in any blend (one with
`instance_id` and `FAIL_TO_PASS` and no `responses_create_params`), converted as it is read.
SWE-bench and SWE-Gym rows carry no image name: add `image` (the instance's docker image,
or `.sif` path) to each before prep.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from rlfleet_contracts.rows import DataError, Row

SWE_AGENT_ENV = "swe_agent"
INSTANCE_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "image",
    "workdir",
    "test_patch",
    "test_command",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
BUNDLED = Path(__file__).resolve().parent / "bundled" / "swe_tiny" / "instances.jsonl"

PROMPT = """You are fixing a bug in the repository at {workdir} ({repo}). The issue:

{problem}

Work with the tools: `bash` runs a shell command in the repository, `view` shows a file or \
directory, `edit` replaces text in a file. Find the cause, fix it in the source (not the \
tests), check your fix, then call `submit`."""


def is_swe_instance(row: Row) -> bool:
    """A raw SWE-bench-style instance (not yet a training row)."""
    return "instance_id" in row and "FAIL_TO_PASS" in row and "responses_create_params" not in row


def swe_row(instance: dict[str, Any]) -> Row:
    """The `swe_agent` training row of one instance; DataError names a missing field."""
    for field in ("instance_id", "image", "FAIL_TO_PASS"):
        if not isinstance(instance.get(field), str | list) or not instance[field]:
            hint = " (the instance's docker image or .sif path; SWE-bench rows lack it)"
            raise DataError(f"{field}: missing or empty" + (hint if field == "image" else ""))
    problem = str(instance.get("problem_statement") or "").strip()
    if not problem:
        raise DataError("problem_statement: missing or empty (the task the policy is given)")
    workdir = str(instance.get("workdir") or "/testbed")
    text = PROMPT.format(
        workdir=workdir, repo=instance.get("repo") or instance["instance_id"], problem=problem
    )
    row: Row = {k: instance[k] for k in INSTANCE_FIELDS if instance.get(k) is not None}
    row["workdir"] = workdir
    row["problem_statement"] = problem
    row["agent_ref"] = {"name": SWE_AGENT_ENV}
    row["responses_create_params"] = {"input": [{"role": "user", "content": text}]}
    return row


@functools.cache
def _bundled() -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in BUNDLED.read_text().splitlines() if line.strip()]
    return {row["instance_id"]: row for row in rows}


def fill_swe_tiny(spec: dict[str, Any]) -> Row:
    """`{"source": "swe_tiny", "instance_id": ...}`: a bundled tiny instance's row."""
    instance_id = spec["instance_id"]
    bundled = _bundled()
    if instance_id not in bundled:
        raise DataError(
            f"_placeholder.instance_id: no bundled instance {instance_id!r}; "
            f"bundled: {', '.join(bundled)}"
        )
    return swe_row(bundled[instance_id])
